"""The residual SwiGLU block, x + W_down(silu(W_gate h) * W_up h), h = RMSNorm(x).

Its forward pass is the plain one; its backward pass is written by hand
(`jax.custom_vjp`) because of how XLA on CPU compiles the autodiff one: the
weight gradients contract over the B*T tokens, so one operand of each must
be transposed to [features, tokens], and XLA fuses the SwiGLU backward's
elementwise work (sigmoid, products) into those transposing copies of the
[B*T, F] gradients, which then run at a small fraction of memory speed (on
the bench-tiny shapes about a third of the whole model's gradient time).
Here the two transposes are of the [B*T, D] arrays instead (D < F: the
normalised input h and the incoming cotangent), made explicit and kept out
of any fusion with `optimization_barrier`; the elementwise gradients are
computed once in their natural layout and feed plain [D, N] x [N, F]
matmuls. The model's gradient is then about 1.3x faster on CPU
(BENCHMARKS.md) and equal to autodiff's to float32 rounding (tests).

Precision follows layers.py: matmuls in the input dtype with float32
accumulation, the norm and all elementwise work in float32, gradients cast
to their primal dtypes.
"""

import functools

import jax
import jax.numpy as jnp

from sat_jax import sharding

_EMBED = ("batch", "length", "act_embed")
_MLP = ("batch", "length", "act_mlp")


def _f32_dot(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


def _normalise(x_BxTxD: jax.Array, eps: float):
  """(x / rms(x), 1 / rms(x)) in float32, the RMSNorm of layers.py."""
  xf = x_BxTxD.astype(jnp.float32)
  rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf), axis=-1, keepdims=True) + eps)
  return xf * rstd, rstd


def _norm(x_BxTxD, scale_D, eps):
  # The exact expression of layers.rms_norm (same rounding in bfloat16).
  xhat, _ = _normalise(x_BxTxD, eps)
  return scale_D[None, None] * xhat.astype(x_BxTxD.dtype)


def _forward(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps):
  h = _norm(x_BxTxD, scale_D, eps)
  gate = _f32_dot("btd,df->btf", h, w_gate_DxF)
  up = _f32_dot("btd,df->btf", h, w_up_DxF)
  act = sharding.shard((jax.nn.silu(gate) * up).astype(h.dtype), _MLP)
  down = _f32_dot("btf,fd->btd", act, w_down_FxD).astype(x_BxTxD.dtype)
  return sharding.shard(x_BxTxD + down, _EMBED), (gate, up)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def swiglu_residual(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps):
  """x + W_down (silu(W_gate h) * W_up h), h = RMSNorm(x) * scale.

  Same values as the autodiff formulation; hand-written backward pass
  (module docstring). `eps` is a Python float.
  """
  return _forward(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps)[0]


def _fwd(x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps):
  y, (gate, up) = _forward(
      x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, eps
  )
  return y, (x_BxTxD, scale_D, w_gate_DxF, w_up_DxF, w_down_FxD, gate, up)


def _transposed(a_NxC: jax.Array) -> jax.Array:
  """a^T materialised on its own: XLA may neither fold it into the matmul's
  dimension numbers nor fuse elementwise producers into it."""
  return jax.lax.optimization_barrier(a_NxC.T)


def _bwd(eps, res, dy_BxTxD):
  x, scale, w_gate, w_up, w_down, gate, up = res
  b, t, d = x.shape
  dt = x.dtype
  n = b * t
  sig = jax.nn.sigmoid(gate)
  silu = gate * sig
  act_NxF = (silu * up).astype(dt).reshape(n, -1)
  dy_NxD = dy_BxTxD.reshape(n, d)
  # dW_down = act^T dy, computed as (dy^T act)^T: the transpose is of dy.
  dw_down = _f32_dot("dn,nf->fd", _transposed(dy_NxD).astype(dt), act_NxF)
  dact = _f32_dot("btd,fd->btf", dy_BxTxD.astype(dt), w_down)
  dgate = dact * up * sig * (1.0 + gate * (1.0 - sig))
  dup = dact * silu
  xhat, rstd = _normalise(x, eps)
  h_NxD = (scale[None, None] * xhat.astype(dt)).reshape(n, d)
  h_DxN = _transposed(h_NxD)
  dgate_NxF = dgate.astype(dt).reshape(n, -1)
  dup_NxF = dup.astype(dt).reshape(n, -1)
  dw_gate = _f32_dot("dn,nf->df", h_DxN, dgate_NxF)
  dw_up = _f32_dot("dn,nf->df", h_DxN, dup_NxF)
  dh = _f32_dot("btf,df->btd", dgate.astype(dt), w_gate) + _f32_dot(
      "btf,df->btd", dup.astype(dt), w_up
  )
  # RMSNorm: h = scale * xhat, xhat = x * rstd.
  dscale = jnp.sum(dh * xhat, axis=(0, 1))
  dxhat = dh * scale.astype(jnp.float32)[None, None]
  dx = rstd * (dxhat - xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True))
  dx = sharding.shard((dy_BxTxD.astype(jnp.float32) + dx).astype(dt), _EMBED)
  return (
      dx,
      dscale.astype(scale.dtype),
      dw_gate.astype(w_gate.dtype),
      dw_up.astype(w_up.dtype),
      dw_down.astype(w_down.dtype),
  )


swiglu_residual.defvjp(_fwd, _bwd)
