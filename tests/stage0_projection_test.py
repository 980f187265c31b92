"""Stage-0 projection and its chunked distillation kernel, against numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax.stage0 import distill
from sat_jax.stage0 import projection


def _log_softmax64(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _kl64(logp, logq):
  return float(np.sum(np.exp(logp) * (logp - logq)))


def _mix64(a, b, beta):
  return _log_softmax64(beta * a + (1 - beta) * b)


def _beta64(a, b, delta0):
  """Independent float64 reference: bisection to 1e-12 on one state."""
  if _kl64(_mix64(a, b, 1.0), b) <= delta0:
    return 1.0
  lo, hi = 0.0, 1.0
  while hi - lo > 1e-12:
    mid = 0.5 * (lo + hi)
    if _kl64(_mix64(a, b, mid), b) <= delta0:
      lo = mid
    else:
      hi = mid
  return lo


@pytest.mark.parametrize("delta0", [0.01, 0.1, 0.3])
def test_two_tokens_match_the_closed_form(delta0):
  # pi_cur uniform, pi_pre = (0.9, 0.1): pi_beta = (9^b, 1) / (9^b + 1), and
  # KL(pi_beta || uniform) = log 2 - H(p): solve for p, then beta.
  logp_pre = jnp.log(jnp.array([[0.9, 0.1]]))
  logp_cur = jnp.log(jnp.array([[0.5, 0.5]]))
  out = projection.project_log_probs(logp_pre, logp_cur, delta0)
  lo, hi = 0.5, 0.9
  for _ in range(100):
    p = 0.5 * (lo + hi)
    kl = np.log(2) + p * np.log(p) + (1 - p) * np.log(1 - p)
    lo, hi = (p, hi) if kl <= delta0 else (lo, p)
  beta = np.log(lo / (1 - lo)) / np.log(9)
  np.testing.assert_allclose(out.beta[0], beta, atol=1e-6)
  np.testing.assert_allclose(jnp.exp(out.log_probs[0, 0]), lo, atol=1e-6)
  np.testing.assert_allclose(out.kl[0], delta0, atol=1e-6)
  np.testing.assert_allclose(out.lam[0], 1 / beta - 1, rtol=1e-5)


def test_random_states_match_float64_bisection():
  rng = np.random.default_rng(0)
  logits_pre = rng.normal(0, 2.0, (3, 4, 37)).astype(np.float32)
  logits_cur = rng.normal(0, 2.0, (3, 4, 37)).astype(np.float32)
  delta0, tau = 0.05, 0.7
  out = projection.project_logits(logits_pre, logits_cur, delta0, tau)
  a = _log_softmax64(logits_pre / tau)
  b = _log_softmax64(logits_cur / tau)
  for idx in np.ndindex(3, 4):
    beta = _beta64(a[idx], b[idx], delta0)
    np.testing.assert_allclose(out.beta[idx], beta, atol=2e-5)
    np.testing.assert_allclose(
        out.log_probs[idx], _mix64(a[idx], b[idx], beta), atol=2e-5
    )
    assert _kl64(_mix64(a[idx], b[idx], float(out.beta[idx])), b[idx]) <= (
        delta0 + 1e-6
    )
  assert float(jnp.max(out.kl)) <= delta0 + 1e-6
  # Every state here starts outside the ball: the constraint is active.
  np.testing.assert_allclose(out.kl, delta0, atol=1e-5)


def test_inside_keeps_pre_and_zero_radius_keeps_cur():
  rng = np.random.default_rng(1)
  logp_pre = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(5, 11))), -1)
  logp_cur = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(5, 11))), -1)
  big = projection.project_log_probs(logp_pre, logp_cur, 1e3)
  np.testing.assert_array_equal(big.beta, 1.0)
  np.testing.assert_allclose(big.log_probs, logp_pre, atol=1e-6)
  np.testing.assert_array_equal(big.lam, 0.0)
  zero = projection.project_log_probs(logp_pre, logp_cur, 0.0)
  np.testing.assert_allclose(zero.log_probs, logp_cur, atol=1e-5)
  assert float(jnp.max(zero.beta)) < 1e-3


def _naive_projected_kl(h_s, w_s, h_pre, w_pre, h_cur, w_cur, delta0, tau):
  """Full [B, T, V] logits, the projection target held fixed."""
  proj = projection.project_logits(h_pre @ w_pre, h_cur @ w_cur, delta0, tau)
  q = jax.lax.stop_gradient(proj.log_probs)
  logp_s = jax.nn.log_softmax((h_s @ w_s) / tau, axis=-1)
  return jnp.sum(jnp.exp(q) * (q - logp_s), axis=-1), proj.beta


def test_chunked_kernel_matches_naive_values_and_gradients():
  rng = np.random.default_rng(2)
  b, t, v = 2, 7, 29
  h_s, h_pre, h_cur = (
      jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32) for d in (8, 12, 6)
  )
  w_s, w_pre, w_cur = (
      jnp.asarray(rng.normal(size=(d, v)) * 0.5, jnp.float32)
      for d in (8, 12, 6)
  )
  delta0, tau = 0.08, 0.9
  loss, beta = distill.projected_kl_from_hidden(
      h_s, w_s, h_pre, w_pre, h_cur, w_cur, delta0, tau, chunk_size=3
  )
  ref_loss, ref_beta = _naive_projected_kl(
      h_s, w_s, h_pre, w_pre, h_cur, w_cur, delta0, tau
  )
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(beta, ref_beta, atol=1e-6)
  weights = jnp.asarray(rng.uniform(size=(b, t)), jnp.float32)

  def chunked(hs, ws):
    out = distill.projected_kl_from_hidden(
        hs, ws, h_pre, w_pre, h_cur, w_cur, delta0, tau, chunk_size=3
    )[0]
    return jnp.sum(weights * out)

  def naive(hs, ws):
    out = _naive_projected_kl(hs, ws, h_pre, w_pre, h_cur, w_cur, delta0, tau)
    return jnp.sum(weights * out[0])

  got = jax.grad(chunked, argnums=(0, 1))(h_s, w_s)
  want = jax.grad(naive, argnums=(0, 1))(h_s, w_s)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_kernel_rejects_mismatched_sides_and_negative_radius():
  h = jnp.zeros((1, 2, 4))
  w = jnp.zeros((4, 9))
  with pytest.raises(ValueError, match="differ in"):
    distill.projected_kl_from_hidden(h, w, h, jnp.zeros((4, 8)), h, w, 0.1)
  with pytest.raises(ValueError, match="delta0=-0.1"):
    distill.projected_kl_from_hidden(h, w, h, w, h, w, -0.1)
