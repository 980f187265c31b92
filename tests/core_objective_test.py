"""The per-agent objective against an independent numpy implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax.core import agent as agent_lib
from sat_jax.core import batch as batch_lib
from sat_jax.core import config as C
from sat_jax.core import objective
from sat_jax.toy import tabular

S, A, E, T = 2, 3, 6, 4
AGENT = tabular.TabularAgent(S, A)


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _problem(seed=0, params_equal_behaviour=False):
  rng = np.random.default_rng(seed)
  params = rng.normal(size=(S, A)).astype(np.float32)
  beh_params = (
      params
      if params_equal_behaviour
      else (params + 0.3 * rng.normal(size=(S, A))).astype(np.float32)
  )
  state = rng.integers(0, S, size=(E, T))
  action = rng.integers(0, A, size=(E, T))
  mask = rng.random((E, T)) < 0.6
  mask[0] = False  # an episode where the agent does not act
  beh = _log_softmax(beh_params)[state, action]
  view = batch_lib.AgentView(
      inputs={"state": jnp.asarray(state), "action": jnp.asarray(action)},
      mask_ExT=jnp.asarray(mask),
      behaviour_logp_ExT=jnp.asarray(beh, jnp.float32),
  )
  adv = rng.normal(size=E).astype(np.float32)
  c = rng.uniform(0.2, 1.0, size=E).astype(np.float32)
  return params, beh_params, state, action, mask, beh, view, adv, c


def _numpy_loss(
    mode,
    params,
    ref,
    state,
    action,
    mask,
    beh,
    adv,
    c,
    beta,
    eps=0.2,
    eps_hi=0.28,
):
  logratio = np.where(mask, _log_softmax(params)[state, action] - beh, 0.0)
  if mode == "token":
    r = np.exp(logratio)
    s = np.minimum(
        r * adv[:, None], np.clip(r, 1 - eps, 1 + eps_hi) * adv[:, None]
    )
    surrogate = np.sum(np.where(mask, c[:, None] * s, 0)) / mask.sum()
  else:
    u = logratio.sum(1)
    if mode == "seq_mean":
      u = u / np.maximum(mask.sum(1), 1)
    r = np.exp(u)
    s = np.minimum(r * adv, np.clip(r, 1 - eps, 1 + eps_hi) * adv)
    has = mask.any(1)
    surrogate = np.sum(np.where(has, c * s, 0)) / has.sum()
  p_new, lp_new, lp_old = (
      np.exp(_log_softmax(params)),
      _log_softmax(params),
      _log_softmax(ref),
  )
  kl_s = np.sum(p_new * (lp_new - lp_old), -1)
  kl = np.sum(np.where(mask, kl_s[state], 0)) / mask.sum()
  return -surrogate + beta * kl


@pytest.mark.parametrize("mode", ["seq", "seq_mean", "token"])
def test_loss_matches_numpy(mode):
  params, beh_params, state, action, mask, beh, view, adv, c = _problem()
  ref = beh_params + 0.1
  cfg = C.UpdateConfig(ratio_mode=mode, epsilon=0.2, epsilon_high=0.28)
  loss, _ = objective.agent_loss(
      jnp.asarray(params),
      jnp.asarray(ref, jnp.float32),
      AGENT,
      cfg,
      view,
      jnp.asarray(adv),
      jnp.asarray(c),
      0.7,
  )
  expected = _numpy_loss(
      mode, params, ref, state, action, mask, beh, adv, c, 0.7
  )
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def _numpy_policy_gradient(params, state, action, mask, adv, c):
  """dL/dlogits at r = 1 (seq): sum_tau c A sum_t (onehot(a_t) - p(s_t))."""
  p = np.exp(_log_softmax(params))
  grad = np.zeros_like(params, np.float64)
  has = mask.any(1)
  for e, t in zip(*np.nonzero(mask)):
    g = -p[state[e, t]].copy()
    g[action[e, t]] += 1
    grad[state[e, t]] += c[e] * adv[e] * g
  return grad / has.sum()


def test_gradient_at_the_behaviour_policy_is_the_policy_gradient():
  params, _, state, action, mask, _, view, adv, c = _problem(
      1, params_equal_behaviour=True
  )
  cfg = C.UpdateConfig()
  grad, _ = jax.grad(objective.agent_loss, has_aux=True)(
      jnp.asarray(params),
      jnp.asarray(params),
      AGENT,
      cfg,
      view,
      jnp.asarray(adv),
      jnp.asarray(c),
      5.0,  # grad KL = 0 at the reference
  )
  expected = -_numpy_policy_gradient(params, state, action, mask, adv, c)
  np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-6)


def _update(cfg, params, beta, kl_penalty, view, adv, c, delta=1e9):
  state0 = agent_lib.init_team(
      [AGENT], [jnp.asarray(params)], C.SATConfig(update=cfg, max_backtracks=0)
  )[0]
  return objective.update_agent(
      AGENT,
      cfg,
      state0.params,
      state0.opt_state,
      state0.params,
      jnp.float32(beta),
      jnp.float32(1.0),
      jnp.float32(delta),
      view,
      jnp.asarray(adv),
      jnp.asarray(c),
      jax.random.key(0),
      kl_penalty=kl_penalty,
  )


def test_sgd_step_and_monitor_metrics():
  params, _, state, action, mask, _, view, adv, c = _problem(
      2, params_equal_behaviour=True
  )
  lr = 0.5
  cfg = C.UpdateConfig(
      epochs=1,
      minibatches=1,
      quantile=0.75,
      optimizer=C.OptimizerConfig("sgd", lr, grad_clip=None),
  )
  delta = 1e-3
  new, _, m, _ = _update(cfg, params, 0.0, True, view, adv, c, delta)
  step = lr * _numpy_policy_gradient(params, state, action, mask, adv, c)
  np.testing.assert_allclose(np.asarray(new), params + step, atol=1e-6)
  p_new, lp_new = np.exp(_log_softmax(new)), _log_softmax(new)
  kl_s = np.sum(p_new * (lp_new - _log_softmax(params)), -1)
  kl_own = kl_s[state][mask]
  q = np.quantile(kl_own, 0.75, method="inverted_cdf")
  np.testing.assert_allclose(float(m["kl_quantile"]), q, rtol=1e-4, atol=1e-7)
  assert bool(m["violated"]) == (q > delta)
  np.testing.assert_allclose(
      float(m["violation_rate"]), np.mean(kl_own > delta), rtol=1e-6
  )


def test_masked_quantile_is_the_inverted_cdf():
  rng = np.random.default_rng(3)
  for q in (0.5, 0.9, 0.99):
    x = rng.exponential(size=(7, 9)).astype(np.float32)
    mask = rng.random((7, 9)) < 0.5
    got = float(objective.masked_quantile(jnp.asarray(x), jnp.asarray(mask), q))
    assert got == np.quantile(x[mask], q, method="inverted_cdf")
  empty = objective.masked_quantile(
      jnp.ones((2, 2)), jnp.zeros((2, 2), bool), 0.9
  )
  assert float(empty) == 0.0


def test_update_without_kl_term_equals_beta_zero_and_returns_u():
  params, _, state, action, mask, beh, view, adv, c = _problem(4)
  cfg = C.UpdateConfig(
      epochs=2,
      minibatches=2,
      optimizer=C.OptimizerConfig("sgd", 0.5, grad_clip=None),
  )
  p0, _, m0, u0 = _update(cfg, params, 0.0, True, view, adv, c)
  p1, _, m1, u1 = _update(cfg, params, 0.0, False, view, adv, c)
  np.testing.assert_allclose(np.asarray(p1), np.asarray(p0), atol=1e-6)
  np.testing.assert_allclose(np.asarray(u1), np.asarray(u0), atol=1e-6)
  assert float(m1["kl_quantile"]) == pytest.approx(float(m0["kl_quantile"]))
  # With beta > 0 the penalty changes the second step (able to fail).
  p2, *_ = _update(cfg, params, 5.0, True, view, adv, c)
  assert np.max(np.abs(np.asarray(p2) - np.asarray(p0))) > 1e-3
  # u_E is the new params' sequence log-ratio (numpy, float64).
  logp = _log_softmax(np.asarray(p1))[state, action]
  expected = np.sum(np.where(mask, logp - beh, 0.0), axis=1)
  np.testing.assert_allclose(np.asarray(u1), expected, atol=1e-5)
  np.testing.assert_allclose(
      np.asarray(objective.sequence_logratio(AGENT, p1, view)),
      np.asarray(u1),
      atol=1e-6,
  )
