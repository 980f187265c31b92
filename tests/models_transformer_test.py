"""Tests of the JAX model: axes, causality, padding, KV cache, sharding."""

import functools

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax import models
from sat_jax import sharding
from sat_jax import testing

_CONFIG = testing.tiny_config("qwen3")
_forward = jax.jit(models.forward, static_argnums=0)
_init = jax.jit(models.init_params, static_argnums=(0, 2))


@functools.partial(jax.jit, static_argnums=0)
def _scaled_init(config, key):
  params = models.init_params(config, key)
  # Larger weights than the 0.02 init, so logits depend on the inputs.
  return jax.tree.map(lambda x: x * 4 if x.ndim >= 3 else x, params)


@functools.lru_cache(maxsize=None)
def _params(family="qwen3"):
  return _scaled_init(testing.tiny_config(family), jax.random.key(1))


def _tokens(seed, shape):
  return np.random.default_rng(seed).integers(0, 512, shape).astype(np.int32)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_param_axes_name_every_dimension(family):
  config = testing.tiny_config(family)
  params = jax.eval_shape(lambda: models.init_params(config, jax.random.key(0)))
  axes = models.param_axes(config)
  assert jax.tree.structure(params) == jax.tree.structure(
      axes, is_leaf=lambda x: isinstance(x, tuple)
  )
  known = {name for name, _ in sharding.DEFAULT_RULES}
  for p, names in zip(
      jax.tree.leaves(params),
      jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)),
  ):
    assert len(names) == p.ndim and set(names) <= known
  assert axes["layers"]["q_proj"] == ("layers", "embed", "heads", "head_dim")
  assert ("lm_head" in params) == (not config.tie_embeddings)
  assert ("q_bias" in params["layers"]) == (family == "qwen2")
  assert ("q_norm" in params["layers"]) == (family == "qwen3")


def test_causal():
  params = _params()
  tokens = _tokens(2, (2, 10))
  changed = tokens.copy()
  changed[:, 6] = (tokens[:, 6] + 1) % 512
  a, b = _forward(_CONFIG, params, tokens), _forward(_CONFIG, params, changed)
  np.testing.assert_array_equal(a[:, :6], b[:, :6])
  assert np.abs(a[:, 6:] - b[:, 6:]).min() > 0


def test_left_and_right_padding_agree_and_padding_is_ignored():
  params = _params()
  real = np.array([5, 17, 99, 3, 250, 42], np.int32)
  pad = np.full(4, 7, np.int32)
  tokens = np.stack([
      np.concatenate([pad, real]),  # left padded
      np.concatenate([real, pad]),  # right padded
      np.concatenate([pad + 300, real]),  # left, other padding ids
  ])
  lmask = (np.arange(10) >= 4).astype(np.int32)
  mask = np.stack([lmask, lmask[::-1].copy(), lmask])
  out = _forward(_CONFIG, params, tokens, mask)
  np.testing.assert_allclose(out[0, 4:], out[1, :6], atol=1e-5)
  np.testing.assert_allclose(out[0, 4:], out[2, 4:], atol=1e-6)
  unpadded = _forward(_CONFIG, params, real[None], np.ones((1, 6), np.int32))
  np.testing.assert_allclose(out[0, 4:], unpadded[0], atol=1e-5)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _prefill_then_decode(
    config, fused, prefill, params, prompt, prompt_mask, new_BxN
):
  """Stacked-layer prefill, then decode over unstacked (unrolled) layers.

  `fused`: decode with the fused projections and a per-layer (split) cache,
  as `sampling.sample` does for shallow models. `prefill`: the prompt
  attends over its own keys only (the empty-cache shortcut).
  """
  cache = models.init_cache(config, prompt.shape[0], prompt.shape[1] + 4)
  h, cache = models.hidden_states_cached(
      config, params, prompt, cache, prompt_mask, prefill=prefill
  )
  outs = [models.logits_from_hidden(config, params, h)]
  params = models.unstack_layers(params, fuse=fused)
  if fused:
    cache = cache.split_layers()
  for i in range(new_BxN.shape[1]):
    h, cache = models.hidden_states_cached(
        config, params, new_BxN[:, i : i + 1], cache
    )
    outs.append(models.logits_from_hidden(config, params, h))
  return jnp.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("fused,prefill", [(False, False), (True, True)])
@pytest.mark.parametrize(
    "family", ["qwen3", pytest.param("qwen2", marks=pytest.mark.slow), "llama"]
)
def test_cached_decoding_equals_uncached_forward(family, fused, prefill):
  config = testing.tiny_config(family)
  params = _params(family)
  tokens = _tokens(3, (3, 10))
  mask = np.ones((3, 10), np.int32)
  mask[1, :3] = 0  # left padded prompt
  mask[2, :5] = 0
  cached, cache = _prefill_then_decode(
      config, fused, prefill, params, tokens[:, :6], mask[:, :6], tokens[:, 6:]
  )
  full = _forward(config, params, tokens, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(
      np.asarray(cached)[real], np.asarray(full)[real], atol=1e-5
  )
  assert int(cache.index) == 10
  assert cache.is_split == fused
  np.testing.assert_array_equal(cache.mask_BxS, mask)


def test_chunked_prefill_equals_one_shot():
  params = _params()
  tokens = _tokens(4, (2, 8))

  @jax.jit
  def run(params, tokens):
    cache = models.init_cache(_CONFIG, 2, 8)
    h_all, _ = models.hidden_states_cached(_CONFIG, params, tokens, cache)
    h1, c = models.hidden_states_cached(
        _CONFIG, params, tokens[:, :3], cache, prefill=True
    )
    h2, _ = models.hidden_states_cached(_CONFIG, params, tokens[:, 3:], c)
    return jnp.concatenate([h1, h2], 1), h_all

  chunked, one_shot = run(params, tokens)
  np.testing.assert_allclose(chunked, one_shot, atol=1e-5)


def test_sharded_forward_equals_unsharded():
  mesh = jax.make_mesh(
      (2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3
  )
  params = _params()
  axes = models.param_axes(_CONFIG)
  shardings = jax.tree.map(
      lambda names: NamedSharding(mesh, sharding.logical_to_spec(names)),
      axes,
      is_leaf=lambda x: isinstance(x, tuple),
  )
  sharded = jax.device_put(params, shardings)
  spec = sharded["layers"]["gate_proj"].sharding.spec
  assert tuple(spec) == (None, "fsdp", "tensor")
  tokens = _tokens(5, (4, 8))
  mask = np.ones((4, 8), np.int32)
  with jax.set_mesh(mesh):
    out = jax.jit(models.forward, static_argnums=0)(
        _CONFIG, sharded, tokens, mask
    )
  np.testing.assert_allclose(
      out, _forward(_CONFIG, params, tokens, mask), atol=1e-5
  )


@pytest.mark.slow
def test_remat_gives_the_same_gradient():
  config = _CONFIG.replace(num_layers=1)
  params = _init(config, jax.random.key(6))
  tokens = _tokens(6, (2, 6))

  def loss(p, remat):
    logits = models.forward(config, p, tokens, remat=remat)
    return jnp.mean(jax.nn.logsumexp(logits, -1))

  g1 = jax.jit(jax.grad(loss), static_argnums=1)(params, False)
  g2 = jax.jit(jax.grad(loss), static_argnums=1)(params, True)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_init_cache_shapes_and_bytes():
  cache = models.init_cache(_CONFIG, 3, 20, jnp.bfloat16)
  assert cache.kt_LxBxKxHdxS.shape == (2, 3, 2, 16, 20)
  assert cache.kt_LxBxKxHdxS.dtype == jnp.bfloat16
  assert cache.num_slots == 20
  assert (
      models.cache_bytes(_CONFIG, 3, 20, jnp.bfloat16)
      == 2 * 2 * 3 * 20 * 2 * 16 * 2
  )
