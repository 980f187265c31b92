"""The hand-written SwiGLU backward pass against autodiff of the plain block."""

import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import models
from sat_jax import testing
from sat_jax.models import layers

_EPS = 1e-6


def _plain_block(x, scale, w_gate, w_up, w_down):
  """The block written independently, differentiated by JAX (float64-able)."""
  xf = x.astype(jnp.float32) if x.dtype != jnp.float64 else x
  var = jnp.mean(xf * xf, axis=-1, keepdims=True)
  h = scale[None, None] * (xf / jnp.sqrt(var + _EPS)).astype(x.dtype)
  gate = jnp.einsum("btd,df->btf", h, w_gate)
  up = jnp.einsum("btd,df->btf", h, w_up)
  act = gate / (1 + jnp.exp(-gate)) * up
  return x + jnp.einsum("btf,fd->btd", act, w_down)


def _inputs(dtype, seed=0, b=3, t=5, d=16, f=40):
  rng = np.random.default_rng(seed)
  arrays = (
      rng.normal(size=(b, t, d)),
      1 + 0.3 * rng.normal(size=(d,)),
      0.3 * rng.normal(size=(d, f)),
      0.3 * rng.normal(size=(d, f)),
      0.3 * rng.normal(size=(f, d)),
  )
  cotangent = rng.normal(size=(b, t, d))
  return tuple(jnp.asarray(a, dtype) for a in arrays), jnp.asarray(
      cotangent, dtype
  )


def _vjp(fn, args, cotangent):
  out, pull = jax.vjp(fn, *args)
  return out, pull(cotangent)


def test_values_and_gradients_equal_float64_autodiff():
  args, ct = _inputs(jnp.float32)
  out, grads = jax.jit(
      lambda a, c: _vjp(lambda *z: layers.swiglu_residual(*z, _EPS), a, c)
  )(args, ct)
  with jax.enable_x64():
    args64 = tuple(jnp.asarray(np.asarray(a), jnp.float64) for a in args)
    ct64 = jnp.asarray(np.asarray(ct), jnp.float64)
    want_out, want_grads = _vjp(_plain_block, args64, ct64)
    want_out, want_grads = jax.device_get((want_out, want_grads))
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
  names = ("x", "scale", "w_gate", "w_up", "w_down")
  for name, got, want in zip(names, grads, want_grads):
    scale = np.max(np.abs(want))
    assert scale > 1e-2, name  # a gradient that could be wrong
    np.testing.assert_allclose(
        got / scale, want / scale, atol=2e-6, err_msg=name
    )
    assert got.dtype == jnp.float32


def test_bfloat16_gradients_follow_float32_and_keep_dtypes():
  args, ct = _inputs(jnp.bfloat16, seed=1)
  fn = lambda *z: layers.swiglu_residual(*z, _EPS)
  _, grads = jax.jit(lambda a, c: _vjp(fn, a, c))(args, ct)
  args32 = tuple(a.astype(jnp.float32) for a in args)
  _, want = _vjp(_plain_block, args32, ct.astype(jnp.float32))
  for got, ref, arg in zip(grads, want, args):
    assert got.dtype == arg.dtype
    err = np.max(np.abs(np.asarray(got, np.float32) - ref))
    assert err <= 0.05 * np.max(np.abs(ref))


def test_model_gradient_equals_autodiff_of_the_unfused_block(monkeypatch):
  """Whole-model gradient (scan, remat) against the same model with the
  block's plain autodiff formulation patched in."""
  config = testing.tiny_config("qwen3")
  params = models.init_params(config, jax.random.key(3))
  params = jax.tree.map(lambda w: w * 4 if w.ndim >= 3 else w, params)
  tokens = jnp.asarray(
      np.random.default_rng(0).integers(0, config.vocab_size, (2, 7)),
      jnp.int32,
  )
  mask = jnp.asarray([[1] * 7, [0, 0, 1, 1, 1, 1, 1]], jnp.int32)

  def loss(p, remat):
    logits = models.forward(config, p, tokens, mask, remat=remat)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 1] * mask)

  got = jax.grad(loss)(params, False)
  got_remat = jax.grad(loss)(params, True)

  def plain(x, scale, w_gate, w_up, w_down, eps):
    assert eps == config.rms_norm_eps
    return _plain_block(x, scale, w_gate, w_up, w_down)

  monkeypatch.setattr(layers, "swiglu_residual", plain)
  want = jax.grad(loss)(params, False)
  for g, g_remat, w in zip(
      jax.tree.leaves(got), jax.tree.leaves(got_remat), jax.tree.leaves(want)
  ):
    scale = max(float(np.max(np.abs(w))), 1e-6)
    np.testing.assert_allclose(g / scale, w / scale, atol=1e-5)
    np.testing.assert_allclose(g_remat / scale, w / scale, atol=1e-5)
