"""The decoder LM as pure functions: params, axes, forward, KV-cache forward.

Parameters are a plain nested dict. Layer parameters are stacked with a
leading L axis and the stack runs under `lax.scan`, so a model compiles once
whatever its depth. Layouts are "x @ W" (inputs first), with heads split out:

  embed        [V, D]              lm_head   [D, V] (only when untied)
  final_norm   [D]
  layers/attn_norm, mlp_norm [L, D]
  layers/q_proj [L, D, H, Hd]      layers/k_proj, v_proj [L, D, K, Hd]
  layers/o_proj [L, H, Hd, D]      layers/q_bias [L, H, Hd], k/v_bias [L, K, Hd]
  layers/q_norm, k_norm [L, Hd]    (qk_norm families)
  layers/gate_proj, up_proj [L, D, F]    layers/down_proj [L, F, D]

KV cache (`KVCache`): keys transposed [L, B, K, Hd, S] and values
[L, B, K, S, Hd] for every layer (the attention einsums then need no
transpose of the cache), or the same split into one buffer per layer for the
unrolled decode loop; a [B, S] slot mask (1 where a slot holds a real token)
and one scalar write index shared by the batch. `hidden_states_cached`
writes its T new tokens at slots [index, index + T) with an in-place
`dynamic_update_slice` on the layer loop's carry, and lets each query attend
to the valid slots at or before its own. Rows may be left- or right-padded: padding slots are masked,
and positions come from the count of real tokens, not from slot numbers.
"""

import math
from typing import Any

import flax
import jax
import jax.numpy as jnp

from sat_jax import sharding
from sat_jax.models import config as config_lib
from sat_jax.models import layers

ModelConfig = config_lib.ModelConfig
PyTree = Any

_INIT_STD = 0.02  # transformers' initializer_range default.
_FLAT_INIT_MAX = 2**26


def _param_specs(config: ModelConfig) -> dict:
  """name -> (shape, logical axes, init) for every parameter."""
  c = config
  d, f, hd, h, k, l = (
      c.hidden_size,
      c.mlp_dim,
      c.head_dim,
      c.num_heads,
      c.num_kv_heads,
      c.num_layers,
  )
  lay = {
      "attn_norm": ((l, d), ("layers", "norm"), "ones"),
      "q_proj": ((l, d, h, hd), ("layers", "embed", "heads", "head_dim"), "n"),
      "k_proj": (
          (l, d, k, hd),
          ("layers", "embed", "kv_heads", "head_dim"),
          "n",
      ),
      "v_proj": (
          (l, d, k, hd),
          ("layers", "embed", "kv_heads", "head_dim"),
          "n",
      ),
      "o_proj": ((l, h, hd, d), ("layers", "heads", "head_dim", "embed"), "n"),
      "mlp_norm": ((l, d), ("layers", "norm"), "ones"),
      "gate_proj": ((l, d, f), ("layers", "embed", "mlp"), "n"),
      "up_proj": ((l, d, f), ("layers", "embed", "mlp"), "n"),
      "down_proj": ((l, f, d), ("layers", "mlp", "embed"), "n"),
  }
  if c.qkv_bias:
    lay["q_bias"] = ((l, h, hd), ("layers", "heads", "head_dim"), "zeros")
    lay["k_bias"] = ((l, k, hd), ("layers", "kv_heads", "head_dim"), "zeros")
    lay["v_bias"] = ((l, k, hd), ("layers", "kv_heads", "head_dim"), "zeros")
  if c.qk_norm:
    lay["q_norm"] = ((l, hd), ("layers", "norm"), "ones")
    lay["k_norm"] = ((l, hd), ("layers", "norm"), "ones")
  specs = {
      "embed": ((c.vocab_size, d), ("vocab", "embed"), "n"),
      "final_norm": ((d,), ("norm",), "ones"),
      "layers": lay,
  }
  if not c.tie_embeddings:
    specs["lm_head"] = ((d, c.vocab_size), ("embed", "vocab"), "n")
  return specs


def _is_spec(x) -> bool:
  return isinstance(x, tuple) and len(x) == 3 and isinstance(x[2], str)


def param_shapes(config: ModelConfig) -> PyTree:
  """Tree of parameter shapes (tuples), the structure of `init_params`."""
  return jax.tree.map(lambda s: s[0], _param_specs(config), is_leaf=_is_spec)


def param_axes(config: ModelConfig) -> PyTree:
  """Tree of logical axis names, one tuple per parameter (sharding rules)."""
  return jax.tree.map(lambda s: s[1], _param_specs(config), is_leaf=_is_spec)


def init_params(
    config: ModelConfig, key: jax.Array, dtype: Any = jnp.float32
) -> PyTree:
  """Random parameters: N(0, 0.02^2) matrices, unit norms, zero biases.

  XLA on CPU takes most of a second to compile each random draw, so a
  small model draws all its matrices from one flat normal; above
  _FLAT_INIT_MAX elements each matrix gets its own draw (which shards
  without materialising the flat vector).
  """
  specs = _param_specs(config)
  leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
  sizes = [math.prod(s) if init == "n" else 0 for s, _, init in leaves]
  flat = None
  if sum(sizes) <= _FLAT_INIT_MAX:
    flat = jax.random.normal(key, (sum(sizes),), dtype)
  keys = jax.random.split(key, len(leaves))
  out, offset = [], 0
  for (shape, _, init), k, size in zip(leaves, keys, sizes):
    if init == "ones":
      out.append(jnp.ones(shape, dtype))
    elif init == "zeros":
      out.append(jnp.zeros(shape, dtype))
    else:
      draw = (
          jax.random.normal(k, shape, dtype)
          if flat is None
          else flat[offset : offset + size].reshape(shape)
      )
      out.append((_INIT_STD * draw).astype(dtype))
      offset += size
  return jax.tree.unflatten(treedef, out)


def unembed_matrix(config: ModelConfig, params: PyTree) -> jax.Array:
  """The [D, V] output matrix: the tied embedding transposed, or lm_head."""
  if config.tie_embeddings:
    return params["embed"].T
  return params["lm_head"]


def default_positions(mask_BxT: jax.Array) -> jax.Array:
  """Positions of real tokens, 0, 1, 2, ...: cumsum(mask) - 1, clipped at 0."""
  return jnp.maximum(jnp.cumsum(mask_BxT.astype(jnp.int32), axis=1) - 1, 0)


def _embed(
    params: PyTree, tokens_BxT: jax.Array, mask_BxT: jax.Array
) -> jax.Array:
  # Padding ids are arbitrary: one outside the table would gather NaN, which
  # reaches every real position through the masked keys' values (0 * NaN).
  # Padding embeds id 0 instead; its outputs are meaningless anyway.
  tokens_BxT = jnp.where(mask_BxT > 0, tokens_BxT, 0)
  # Gather the (FSDP/TP-sharded) table first, as FSDP does for any weight:
  # the partitioner cannot turn a sharded-table gather into batch-sharded
  # rows without replicating it anyway.
  table = sharding.shard(params["embed"], (None, None))
  x = jnp.take(table, tokens_BxT, axis=0)
  return sharding.shard(x, ("batch", "length", "act_embed"))


def hidden_states(
    config: ModelConfig,
    params: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array | None = None,
    positions_BxT: jax.Array | None = None,
    *,
    remat: bool = False,
) -> jax.Array:
  """Final-norm hidden states h_BxTxD (in the param dtype), no cache.

  `mask_BxT` is 1 for real tokens, 0 for padding (keys at padding are masked
  out; outputs at padding are meaningless). `remat` recomputes each layer in
  the backward pass instead of storing its activations.
  """
  b, t = tokens_BxT.shape
  if mask_BxT is None:
    mask_BxT = jnp.ones((b, t), jnp.int32)
  if positions_BxT is None:
    positions_BxT = default_positions(mask_BxT)
  cos, sin = layers.rope_tables(config, positions_BxT)
  slot_T = jnp.arange(t)
  allowed_BxTxS = (mask_BxT[:, None, :] > 0) & (
      slot_T[None, None, :] <= slot_T[None, :, None]
  )

  def body(x, lp):
    q, k, v = layers.qkv(config, lp, x, cos, sin)
    attn = layers.attention(q, k, v, allowed_BxTxS)
    return layers.attn_out_and_mlp(config, lp, x, attn), None

  if remat:
    body = jax.checkpoint(body)
  x, _ = jax.lax.scan(
      body, _embed(params, tokens_BxT, mask_BxT), params["layers"]
  )
  return layers.rms_norm(x, params["final_norm"], config.rms_norm_eps)


def logits_from_hidden(
    config: ModelConfig,
    params: PyTree,
    h_BxTxD: jax.Array,
    w_DxV: jax.Array | None = None,
) -> jax.Array:
  """float32 logits h @ W_unembed (float32 accumulation of the param dtype).

  `w_DxV` (default: `unembed_matrix(config, params)`) lets a caller pass a
  head it made once, outside a loop that reads it many times.
  """
  if w_DxV is None:
    w_DxV = unembed_matrix(config, params)
  logits = jnp.einsum(
      "...d,dv->...v", h_BxTxD, w_DxV, preferred_element_type=jnp.float32
  )
  if logits.ndim == 3:
    return sharding.shard(logits, ("batch", "length", "act_vocab"))
  return sharding.shard(logits, ("batch", "act_vocab")[-logits.ndim :])


def forward(
    config: ModelConfig,
    params: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array | None = None,
    positions_BxT: jax.Array | None = None,
    *,
    remat: bool = False,
) -> jax.Array:
  """logits_BxTxV (float32) = hidden_states @ unembed_matrix."""
  h = hidden_states(
      config, params, tokens_BxT, mask_BxT, positions_BxT, remat=remat
  )
  return logits_from_hidden(config, params, h)


@flax.struct.dataclass
class KVCache:
  """Per-layer keys/values, slot validity, and the next slot to write.

  Keys are stored transposed (the layouts of `layers.attention`). The
  per-layer buffers are either stacked with a leading L axis (the layer
  `lax.scan`) or, after `split_layers`, a tuple of L separate arrays (the
  unrolled decode loop: each layer's buffers are then their own loop carry,
  updated in place, and no step copies a layer out of the stack).
  """

  kt_LxBxKxHdxS: jax.Array | tuple[jax.Array, ...]
  v_LxBxKxSxHd: jax.Array | tuple[jax.Array, ...]
  mask_BxS: jax.Array  # int32, 1 where the slot holds a real token.
  index: jax.Array  # int32 scalar, the same for every row.

  @property
  def num_slots(self) -> int:
    return self.mask_BxS.shape[1]

  @property
  def is_split(self) -> bool:
    return isinstance(self.kt_LxBxKxHdxS, (list, tuple))

  def split_layers(self) -> "KVCache":
    """The same cache with one buffer per layer (one copy, made once)."""
    if self.is_split:
      return self
    n = self.kt_LxBxKxHdxS.shape[0]
    return self.replace(
        kt_LxBxKxHdxS=tuple(self.kt_LxBxKxHdxS[i] for i in range(n)),
        v_LxBxKxSxHd=tuple(self.v_LxBxKxSxHd[i] for i in range(n)),
    )


def init_cache(
    config: ModelConfig, batch: int, num_slots: int, dtype: Any = jnp.float32
) -> KVCache:
  """An empty (stacked) cache of `num_slots` slots per row."""
  c = config
  kt_shape = (c.num_layers, batch, c.num_kv_heads, c.head_dim, num_slots)
  v_shape = (c.num_layers, batch, c.num_kv_heads, num_slots, c.head_dim)
  kt_names = ("layers", "batch", "act_kv_heads", None, "length")
  v_names = ("layers", "batch", "act_kv_heads", "length", None)
  return KVCache(
      kt_LxBxKxHdxS=sharding.shard(jnp.zeros(kt_shape, dtype), kt_names),
      v_LxBxKxSxHd=sharding.shard(jnp.zeros(v_shape, dtype), v_names),
      mask_BxS=jnp.zeros((batch, num_slots), jnp.int32),
      index=jnp.zeros((), jnp.int32),
  )


def cache_bytes(config: ModelConfig, batch: int, num_slots: int, dtype) -> int:
  """Memory of `init_cache(config, batch, num_slots, dtype)`'s k and v."""
  n = config.num_layers * batch * num_slots * config.num_kv_heads
  return 2 * n * config.head_dim * jnp.dtype(dtype).itemsize


def unstack_layers(params: PyTree, *, fuse: bool = False) -> PyTree:
  """params with "layers" as a list of L per-layer dicts (one copy each).

  `hidden_states_cached` then unrolls its layer loop: each decode step reads
  the weights in place instead of slicing them out of the [L, ...] stacks,
  at the price of compiling L copies of the layer. With `fuse`, each layer
  also gets the fused q/k/v and gate/up projections of `layers.fuse_layer`
  (made in the same copy: fewer, larger matmuls per step).
  """
  stacked = params["layers"]
  n = jax.tree.leaves(stacked)[0].shape[0]
  layers_list = [jax.tree.map(lambda w, i=i: w[i], stacked) for i in range(n)]
  if fuse:
    layers_list = [layers.fuse_layer(lp) for lp in layers_list]
  return dict(params, layers=layers_list)


def hidden_states_cached(
    config: ModelConfig,
    params: PyTree,
    tokens_BxT: jax.Array,
    cache: KVCache,
    mask_BxT: jax.Array | None = None,
    positions_BxT: jax.Array | None = None,
    *,
    prefill: bool = False,
) -> tuple[jax.Array, KVCache]:
  """Runs T new tokens against the cache: (h_BxTxD, cache with them added).

  Used for both prefill (T = prompt bucket, empty cache) and decode (T = 1).
  `prefill=True` promises an empty cache (index 0, no valid slot): the
  tokens then attend over their own T keys, not over all S slots of which
  only T can be valid (half the attention work of a prompt as long as the
  generation); the cache is written the same.
  Default positions continue each row's count of real tokens. The caller
  keeps index + T <= num_slots (`dynamic_update_slice` would clamp).
  `params["layers"]` may be stacked (a `lax.scan`; the cache must be
  stacked too) or a list from `unstack_layers` (an unrolled loop, over a
  stacked or a split cache).
  """
  b, t = tokens_BxT.shape
  if mask_BxT is None:
    mask_BxT = jnp.ones((b, t), jnp.int32)
  mask_BxT = mask_BxT.astype(jnp.int32)
  if positions_BxT is None:
    seen_B = jnp.sum(cache.mask_BxS, axis=1)
    positions_BxT = seen_B[:, None] + default_positions(mask_BxT)
  index = cache.index
  mask_BxS = jax.lax.dynamic_update_slice(cache.mask_BxS, mask_BxT, (0, index))
  # Keys: every cache slot, or (prefill) only the T new ones.
  key_mask_BxS, key_slot_S = (
      (mask_BxT, jnp.arange(t))
      if prefill
      else (mask_BxS, jnp.arange(cache.num_slots))
  )
  query_slot_T = (0 if prefill else index) + jnp.arange(t)
  allowed_BxTxS = (key_mask_BxS[:, None, :] > 0) & (
      key_slot_S[None, None, :] <= query_slot_T[None, :, None]
  )
  cos, sin = layers.rope_tables(config, positions_BxT)

  def write(kt_cache, v_cache, kt, v, lead_index=()):
    """The buffers with the T new slots written in place."""
    kt_cache = jax.lax.dynamic_update_slice(
        kt_cache, kt.astype(kt_cache.dtype), lead_index + (0, 0, 0, index)
    )
    v_cache = jax.lax.dynamic_update_slice(
        v_cache, v.astype(v_cache.dtype), lead_index + (0, 0, index, 0)
    )
    return kt_cache, v_cache

  def attend(x, lp, q, kt_layer, v_layer):
    # In the wider of the two dtypes: a float32 cache of bfloat16 keys and
    # values (`sampling.default_cache_dtype`) is read as stored, since
    # casting it down would convert the whole cache every step; the new
    # queries are widened instead (exactly). The softmax weights are
    # rounded to the activations' dtype as in the uncached pass.
    wide = jnp.promote_types(q.dtype, kt_layer.dtype)
    attn = layers.attention(
        q.astype(wide),
        kt_layer.astype(wide),
        v_layer.astype(wide),
        allowed_BxTxS,
        probs_dtype=q.dtype,
    ).astype(q.dtype)
    return layers.attn_out_and_mlp(config, lp, x, attn)

  x = _embed(params, tokens_BxT, mask_BxT)
  if isinstance(params["layers"], (list, tuple)):
    split = cache.split_layers()
    kts, vs = list(split.kt_LxBxKxHdxS), list(split.v_LxBxKxSxHd)
    for i, lp in enumerate(params["layers"]):
      q, kt, v = layers.qkv(config, lp, x, cos, sin)
      kts[i], vs[i] = write(kts[i], vs[i], kt, v)
      if prefill:  # the new keys as stored (the cache's dtype)
        kt, v = kt.astype(kts[i].dtype), v.astype(vs[i].dtype)
      x = attend(x, lp, q, *((kt, v) if prefill else (kts[i], vs[i])))
    kt_out, v_out = tuple(kts), tuple(vs)
    if not cache.is_split:  # keep the caller's layout
      kt_out, v_out = jnp.stack(kt_out), jnp.stack(v_out)
  else:
    if cache.is_split:
      raise ValueError("stacked layers need a stacked cache (not split)")

    def body(carry, xs):
      # The stacks are the carry, so the new slots are written in place;
      # the layer's buffers are then read out of them (a copy per layer).
      x, kt_all, v_all = carry
      lp, layer = xs
      q, kt, v = layers.qkv(config, lp, x, cos, sin)
      kt_all, v_all = write(kt_all, v_all, kt[None], v[None], (layer,))
      if prefill:  # the new keys as stored (the cache's dtype)
        kt, v = kt.astype(kt_all.dtype), v.astype(v_all.dtype)
        return (attend(x, lp, q, kt, v), kt_all, v_all), None
      kt_l = jax.lax.dynamic_index_in_dim(kt_all, layer, keepdims=False)
      v_l = jax.lax.dynamic_index_in_dim(v_all, layer, keepdims=False)
      return (attend(x, lp, q, kt_l, v_l), kt_all, v_all), None

    layer_L = jnp.arange(config.num_layers)
    carry = (x, cache.kt_LxBxKxHdxS, cache.v_LxBxKxSxHd)
    (x, kt_out, v_out), _ = jax.lax.scan(
        body, carry, (params["layers"], layer_L)
    )
  h = layers.rms_norm(x, params["final_norm"], config.rms_norm_eps)
  return h, KVCache(kt_out, v_out, mask_BxS, index + t)
