"""Decoder building blocks: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Shape letters: B batch, T query time, S key slots, D model dim, H query heads,
K kv heads, G = H / K query heads per kv head, Hd head dim, F mlp dim.

Precision: matmuls run in the parameter dtype with float32 accumulation
(`preferred_element_type`); norms, RoPE and the softmax run in float32, and
results are cast back to the activation dtype. With float32 params everything
is float32.
"""

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import sharding
from sat_jax.models import config as config_lib

# A finite "minus infinity": a query row whose keys are all masked (a padding
# query) gets a uniform softmax instead of NaNs, so gradients stay finite.
_MASKED = -1e30

# Logical names of the main activations (sat_jax/sharding.py rules).
_EMBED = ("batch", "length", "act_embed")
_MLP = ("batch", "length", "act_mlp")
_HEADS = ("batch", "length", "act_heads", None)
_KV_HEADS = ("batch", "act_kv_heads", "length", None)
_KEYS_T = ("batch", "act_kv_heads", None, "length")


def lead(w: jax.Array, ndim: int) -> jax.Array:
  """`w` with leading unit axes up to `ndim` (explicit broadcasting)."""
  return w.reshape((1,) * (ndim - w.ndim) + w.shape)


def dot(spec: str, x: jax.Array, w: jax.Array) -> jax.Array:
  """einsum in the input dtype with float32 accumulation."""
  out = jnp.einsum(spec, x, w, preferred_element_type=jnp.float32)
  return out.astype(x.dtype)


def _normalised(x: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
  """(x / rms(x), 1 / rms(x)) in float32, rms over the last axis."""
  xf = x.astype(jnp.float32)
  rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
  return xf * rstd, rstd


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """y = scale * x / sqrt(mean(x^2) + eps), the mean over the last axis."""
  return lead(scale, x.ndim) * _normalised(x, eps)[0].astype(x.dtype)


def rope_inv_freq(config: config_lib.ModelConfig) -> np.ndarray:
  """Inverse RoPE frequencies f_i = theta^(-2i / Hd), scaled if configured.

  Computed in float32 with numpy, in the same order of operations as
  transformers, so that positions map to the same angles.
  """
  hd = config.head_dim
  exponent = np.arange(0, hd, 2, dtype=np.int64).astype(np.float32) / hd
  inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponent)).astype(
      np.float32
  )
  s = config.rope_scaling
  if s is None:
    return inv_freq
  old_len = s.original_max_position_embeddings
  low_wavelen = old_len / s.low_freq_factor
  high_wavelen = old_len / s.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (old_len / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor
  )
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(
    config: config_lib.ModelConfig, positions_BxT: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """cos and sin of the angles p * f_i, each [B, T, Hd / 2], float32."""
  inv_freq = jnp.asarray(rope_inv_freq(config))
  angles = positions_BxT.astype(jnp.float32)[..., None] * inv_freq[None, None]
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x_BxTxNxHd: jax.Array, cos: jax.Array, sin: jax.Array):
  """Rotates (x1, x2) = halves of the head dim by the position angles.

  (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin): the "rotate half" layout
  of the Hugging Face checkpoints.
  """
  x1, x2 = jnp.split(x_BxTxNxHd.astype(jnp.float32), 2, axis=-1)
  c, s = cos[:, :, None, :], sin[:, :, None, :]
  out = jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
  return out.astype(x_BxTxNxHd.dtype)


def attention(
    q_BxTxHxHd: jax.Array,
    kt_BxKxHdxS: jax.Array,
    v_BxKxSxHd: jax.Array,
    allowed_BxTxS: jax.Array,
    probs_dtype: Any = None,
) -> jax.Array:
  """softmax(q k^T / sqrt(Hd) + mask) v with K kv heads shared by G queries.

  Keys come transposed ([B, K, Hd, S]) and values head-major ([B, K, S,
  Hd]), the KV cache's layouts: both einsums then batch over (b, k) and run
  along contiguous slots, with no transpose of the cache (on CPU the
  transposed keys make the one-token decode step's QK^T about 1.5x faster
  than [B, K, S, Hd] keys). The G query heads of a kv head are folded into
  the query rows, so keys and values are never repeated G times.
  `allowed_BxTxS` carries both causality and padding, which makes left
  padding, right padding and the KV cache one code path. Plain einsums
  rather than `jax.nn.dot_product_attention`: the masks here are arbitrary
  [B, T, S] patterns, and on CPU (where this runs most) the XLA path is what
  that function would use anyway. The softmax weights are rounded to
  `probs_dtype` (default: the values' dtype) before the value product.
  Returns [B, T, H, Hd].
  """
  b, t, h, hd = q_BxTxHxHd.shape
  k = kt_BxKxHdxS.shape[1]
  g = h // k
  q_BxKxQxHd = (
      q_BxTxHxHd.reshape(b, t, k, g, hd)
      .transpose(0, 2, 3, 1, 4)
      .reshape(b, k, g * t, hd)
  )
  scores_BxKxQxS = jnp.einsum(
      "bkqd,bkds->bkqs",
      q_BxKxQxHd,
      kt_BxKxHdxS,
      preferred_element_type=jnp.float32,
  ) * (hd**-0.5)
  allowed_BxQxS = jnp.tile(allowed_BxTxS, (1, g, 1))
  scores_BxKxQxS = jnp.where(allowed_BxQxS[:, None], scores_BxKxQxS, _MASKED)
  probs = jax.nn.softmax(scores_BxKxQxS, axis=-1).astype(
      probs_dtype or v_BxKxSxHd.dtype
  )
  out = jnp.einsum(
      "bkqs,bksd->bkqd", probs, v_BxKxSxHd, preferred_element_type=jnp.float32
  )
  out = out.astype(q_BxTxHxHd.dtype).reshape(b, k, g, t, hd)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


def fuse_layer(lp: dict) -> dict:
  """One layer's weights with the decode-time fused projections.

  qkv_fused [D, K, G + 2, Hd]: per kv head, its G query heads (query head
  h uses kv head h // G, the Hugging Face GQA order), its key and its value;
  gate_up_fused [D, 2, F]. One matmul then replaces three (two), and every
  split is along an axis that no mesh rule shards, so a tensor-parallel
  layout (kv heads, mlp) stays as it was. The unfused entries are dropped.
  """
  d, h, hd = lp["q_proj"].shape
  k = lp["k_proj"].shape[1]
  q_DxKxGxHd = lp["q_proj"].reshape(d, k, h // k, hd)
  fused = dict(lp)
  fused["qkv_fused"] = jnp.concatenate(
      [q_DxKxGxHd, lp["k_proj"][:, :, None], lp["v_proj"][:, :, None]], axis=2
  )
  fused["gate_up_fused"] = jnp.stack([lp["gate_proj"], lp["up_proj"]], axis=1)
  for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
    del fused[name]
  return fused


def qkv(
    config: config_lib.ModelConfig,
    lp: dict,
    x_BxTxD: jax.Array,
    cos: jax.Array,
    sin: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Pre-norm, projections (+ bias, + q/k norm), RoPE on q and k.

  `lp` holds either the checkpoint's separate projections or the fused one
  of `fuse_layer`. Returns q [B, T, H, Hd], the keys transposed [B, K, Hd,
  T] and the values [B, K, T, Hd] (the layouts of `attention`).
  """
  h = rms_norm(x_BxTxD, lp["attn_norm"], config.rms_norm_eps)
  if "qkv_fused" in lp:
    b, t, _ = h.shape
    proj = dot("btd,dkjh->btkjh", h, lp["qkv_fused"])
    g = proj.shape[3] - 2
    q = proj[:, :, :, :g].reshape(b, t, config.num_heads, config.head_dim)
    k, v = proj[:, :, :, g], proj[:, :, :, g + 1]
  else:
    q = dot("btd,dnh->btnh", h, lp["q_proj"])
    k = dot("btd,dnh->btnh", h, lp["k_proj"])
    v = dot("btd,dnh->btnh", h, lp["v_proj"])
  if config.qkv_bias:
    q = q + lead(lp["q_bias"], 4)
    k = k + lead(lp["k_bias"], 4)
    v = v + lead(lp["v_bias"], 4)
  if config.qk_norm:
    q = rms_norm(q, lp["q_norm"], config.rms_norm_eps)
    k = rms_norm(k, lp["k_norm"], config.rms_norm_eps)
  q = sharding.shard(apply_rope(q, cos, sin), _HEADS)
  k = sharding.shard(apply_rope(k, cos, sin).transpose(0, 2, 3, 1), _KEYS_T)
  v = sharding.shard(v.transpose(0, 2, 1, 3), _KV_HEADS)
  return q, k, v


def attn_out_and_mlp(
    config: config_lib.ModelConfig,
    lp: dict,
    x_BxTxD: jax.Array,
    attn_BxTxHxHd: jax.Array,
) -> jax.Array:
  """Residual output projection, then the residual SwiGLU MLP.

  x += o(attn); x += W_down (silu(W_gate h) * W_up h), h = RMSNorm(x).
  With the checkpoint's separate projections the MLP is `swiglu_residual`
  (hand-written backward pass); the decode-time fused gate/up of
  `fuse_layer` computes the same values with one matmul.
  """
  x = x_BxTxD + dot("btnh,nhd->btd", attn_BxTxHxHd, lp["o_proj"])
  x = sharding.shard(x, _EMBED)
  eps = config.rms_norm_eps
  if "gate_up_fused" not in lp:  # the training/scoring path
    return swiglu_residual(
        x, lp["mlp_norm"], lp["gate_proj"], lp["up_proj"], lp["down_proj"], eps
    )
  gate_up = _f32_dot(
      "btd,dzf->btzf", rms_norm(x, lp["mlp_norm"], eps), lp["gate_up_fused"]
  )
  return _swiglu_out(x, gate_up[:, :, 0], gate_up[:, :, 1], lp["down_proj"])


# The residual SwiGLU block with a hand-written backward pass. XLA on CPU
# compiles autodiff's badly: the weight gradients contract over the B*T
# tokens, so one operand of each is transposed to [features, tokens], and XLA
# fuses the SwiGLU backward's elementwise work (sigmoid, products) into those
# transposing copies of the [B*T, F] gradients, which then run far below
# memory speed (about a third of the whole model's gradient on the
# bench-tiny shapes). Here the transposes are of the [B*T, D] arrays instead
# (D < F: the normalised input and the incoming cotangent), explicit and
# kept out of any fusion with `optimization_barrier`, and the elementwise
# gradients are computed once in their own layout: the model's gradient is
# 1.3-1.4x faster on CPU (benchmarks/bench_model_grad.py) and equal to
# autodiff's to float32 rounding (tests/models_swiglu_test.py). Precision as
# above: matmuls in the input dtype with float32 accumulation, the norm and
# the elementwise work in float32, gradients in their primal dtypes.


def _f32_dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _swiglu_out(x_BxTxD, gate_BxTxF, up_BxTxF, w_down_FxD):
  """x + W_down (silu(gate) * up), gate and up in float32."""
  act = (jax.nn.silu(gate_BxTxF) * up_BxTxF).astype(x_BxTxD.dtype)
  x = x_BxTxD + dot("btf,fd->btd", sharding.shard(act, _MLP), w_down_FxD)
  return sharding.shard(x, _EMBED)


def _swiglu_forward(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps):
  h = rms_norm(x_BxTxD, scale_D, eps)
  gate = _f32_dot("btd,df->btf", h, w_gate_DxF)
  up = _f32_dot("btd,df->btf", h, w_up_DxF)
  return _swiglu_out(x_BxTxD, gate, up, w_down_FxD), (gate, up)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def swiglu_residual(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps):
  """x + W_down (silu(W_gate h) * W_up h), h = RMSNorm(x) * scale.

  Autodiff's values; a hand-written backward pass (the comment above).
  `eps` is a Python float.
  """
  return _swiglu_forward(
      x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps
  )[0]


def _swiglu_fwd(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps):
  y, (gate, up) = _swiglu_forward(
      x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps
  )
  return y, (x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, gate, up)


def _transposed(a_NxC: jax.Array) -> jax.Array:
  """a^T materialised on its own: XLA may neither fold it into the matmul's
  dimension numbers nor fuse elementwise producers into it."""
  return jax.lax.optimization_barrier(a_NxC.T)


def _swiglu_bwd(eps, res, dy_BxTxD):
  x, scale, w_gate, w_up, w_down, gate, up = res
  b, t, d = x.shape
  dt = x.dtype
  n = b * t
  sig = jax.nn.sigmoid(gate)
  silu = gate * sig
  act_NxF = (silu * up).astype(dt).reshape(n, -1)
  # dW_down = act^T dy, computed as (dy^T act)^T: the transpose is of dy.
  dw_down = _f32_dot("dn,nf->fd", _transposed(dy_BxTxD.reshape(n, d)), act_NxF)
  dact = _f32_dot("btd,fd->btf", dy_BxTxD, w_down)
  dgate = (dact * up * sig * (1.0 + gate * (1.0 - sig))).astype(dt)
  dup = (dact * silu).astype(dt)
  xhat, rstd = _normalised(x, eps)
  h_DxN = _transposed((lead(scale, 3) * xhat.astype(dt)).reshape(n, d))
  dw_gate = _f32_dot("dn,nf->df", h_DxN, dgate.reshape(n, -1))
  dw_up = _f32_dot("dn,nf->df", h_DxN, dup.reshape(n, -1))
  dh = _f32_dot("btf,df->btd", dgate, w_gate)
  dh = dh + _f32_dot("btf,df->btd", dup, w_up)
  # RMSNorm: h = scale * xhat, xhat = x * rstd.
  dscale = jnp.sum(dh * xhat, axis=(0, 1))
  dxhat = dh * lead(scale, 3).astype(jnp.float32)
  dx = rstd * (dxhat - xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True))
  dx = sharding.shard((dy_BxTxD.astype(jnp.float32) + dx).astype(dt), _EMBED)
  return (
      dx,
      dscale.astype(scale.dtype),
      dw_gate.astype(w_gate.dtype),
      dw_up.astype(w_up.dtype),
      dw_down.astype(w_down.dtype),
  )


swiglu_residual.defvjp(_swiglu_fwd, _swiglu_bwd)
