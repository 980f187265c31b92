"""Backtracking restores params and optimizer state bitwise; rejects cleanly."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax.core import advantage
from sat_jax.core import agent as agent_lib
from sat_jax.core import config as C
from sat_jax.core import objective
from sat_jax.core import trust_region
from sat_jax.toy import games
from sat_jax.toy import tabular

GAME = games.climbing_game()


def _cfg(beta_init=0.05, **kw):
  update = C.UpdateConfig(
      epochs=3,
      minibatches=2,
      optimizer=C.OptimizerConfig("adam", 0.05, grad_clip=None),
  )
  return C.SATConfig(update=update, beta_init=beta_init, **kw)


def _setup(cfg, seed=0):
  rng = np.random.default_rng(seed)
  logits = [rng.normal(size=(1, 3)) for _ in GAME.agents]
  team = agent_lib.init_team(GAME.agents, GAME.init_params(logits), cfg)
  batch = GAME.rollout_fn(4, 8)(
      agent_lib.team_params(team), jax.random.key(seed)
  )
  adv = advantage.sequence_advantages(
      batch.reward_E,
      batch.group_E,
      jnp.zeros(32),
      num_groups=4,
      a_clip=5.0,
      std_eps=1e-6,
  )
  return team[0], batch.views[0], adv


def _leaves_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(la, lb)
  )


def test_rejected_update_leaves_the_agent_bitwise_unchanged():
  cfg = _cfg(delta=1e-12, max_backtracks=3)
  state, view, adv = _setup(cfg)
  new, rec, _ = trust_region.update_with_backtracking(
      GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(1), cfg
  )
  assert not rec["accepted"] and rec["tries"] == 4
  assert float(rec["kl_quantile"]) > 1e-12
  assert _leaves_equal(new.params, state.params)
  assert _leaves_equal(new.opt_state, state.opt_state)
  np.testing.assert_allclose(float(new.beta), 0.05 * 1.5**4, rtol=1e-6)
  assert float(rec["surrogate_gain"]) == 0.0


def _try_scaled(cfg, state, view, adv, beta, scale, key):
  return objective.update_agent(
      GAME.agents[0],
      cfg.update,
      state.params,
      state.opt_state,
      state.params,
      jnp.asarray(beta, jnp.float32),
      jnp.asarray(scale, jnp.float32),
      state.delta,
      view,
      adv.adv_E,
      adv.c_E,
      key,
  )


def test_raising_beta_changes_the_retried_step():
  cfg = _cfg(beta_init=2.0)
  state, view, adv = _setup(cfg)
  key = jax.random.key(2)
  p1, _, _, _ = _try_scaled(cfg, state, view, adv, 2.0, 1.0, key)
  p2, _, _, _ = _try_scaled(cfg, state, view, adv, 3.0, 1.0, key)
  assert not np.array_equal(np.asarray(p1), np.asarray(p2))


def test_backtrack_restores_params_and_optimizer_state():
  cfg = _cfg(backtrack_step_scale=0.5)
  state, view, adv = _setup(cfg)
  key = jax.random.key(2)
  _, _, m1, _ = _try_scaled(cfg, state, view, adv, 0.05, 1.0, key)
  p2, o2, m2, _ = _try_scaled(cfg, state, view, adv, 0.05 * 1.5, 0.5, key)
  q1, q2 = float(m1["kl_quantile"]), float(m2["kl_quantile"])
  assert q2 < q1  # a halved step moves less
  state = state.replace(delta=jnp.float32(0.5 * (q1 + q2)))
  new, rec, _ = trust_region.update_with_backtracking(
      GAME.agents[0], state, view, adv.adv_E, adv.c_E, key, cfg
  )
  assert rec["accepted"] and rec["tries"] == 2
  # Try 2 started from the restored pre-update state: bitwise the same as a
  # fresh try from it, including Adam's moments and step count.
  assert _leaves_equal(new.params, p2)
  assert _leaves_equal(new.opt_state, o2)
  counts = [x for x in jax.tree.leaves(new.opt_state) if x.dtype == jnp.int32]
  assert [int(x) for x in counts] == [cfg.update.num_steps]
  np.testing.assert_allclose(float(new.beta), 0.05 * 1.5, rtol=1e-6)


def test_accepted_updates_never_violate():
  for seed in range(4):
    for delta in (3e-4, 3e-3, 3e-2):
      cfg = _cfg(delta=delta, max_backtracks=2)
      state, view, adv = _setup(cfg, seed)
      new, rec, _ = trust_region.update_with_backtracking(
          GAME.agents[0],
          state,
          view,
          adv.adv_E,
          adv.c_E,
          jax.random.key(seed),
          cfg,
      )
      kl = float(tabular.TabularAgent.kl_per_state(new.params, state.params)[0])
      if rec["accepted"]:
        assert kl <= delta * (1 + 1e-5)
      else:
        assert kl == 0.0


def test_beta_decays_after_a_first_try_acceptance():
  cfg = _cfg(delta=10.0)
  state, view, adv = _setup(cfg)
  state = state.replace(beta=jnp.float32(0.3))
  new, rec, _ = trust_region.update_with_backtracking(
      GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(0), cfg
  )
  assert rec["accepted"] and rec["tries"] == 1
  np.testing.assert_allclose(float(new.beta), 0.3 / 1.5, rtol=1e-6)
  low = state.replace(beta=jnp.float32(0.06))
  new, _, _ = trust_region.update_with_backtracking(
      GAME.agents[0], low, view, adv.adv_E, adv.c_E, jax.random.key(0), cfg
  )
  np.testing.assert_allclose(float(new.beta), 0.05, rtol=1e-6)  # beta_init


def test_beta_decays_to_the_agents_own_start_value():
  cfg = _cfg(beta_init=(1e-4, 0.05), delta=10.0)
  state, view, adv = _setup(cfg)
  assert float(state.beta) == pytest.approx(1e-4)  # agent 0's own start

  def update(beta, **kw):
    return trust_region.update_with_backtracking(
        GAME.agents[0],
        state.replace(beta=jnp.float32(beta)),
        view,
        adv.adv_E,
        adv.c_E,
        jax.random.key(0),
        cfg,
        **kw,
    )

  new, rec, _ = update(1.2e-4, beta_init=1e-4)
  assert rec["accepted"] and rec["tries"] == 1
  # max(1e-4, 1.2e-4 / 1.5): the agent's floor, not another agent's 0.05.
  np.testing.assert_allclose(float(new.beta), 1e-4, rtol=1e-6)
  new, _, _ = update(0.3, beta_init=1e-4)
  np.testing.assert_allclose(float(new.beta), 0.2, rtol=1e-6)
  with pytest.raises(ValueError, match="per agent"):
    update(1e-4)  # a per-agent beta_init needs this agent's value


def test_a_retry_that_could_not_differ_is_not_run():
  # beta already at beta_max and no step scaling: a retry would repeat the
  # violating try bitwise (the public code's bug), so the update is
  # rejected after one try instead of four identical ones.
  cfg = _cfg(beta_init=0.05, beta_max=0.05, delta=1e-12, max_backtracks=3)
  state, view, adv = _setup(cfg)
  new, rec, _ = trust_region.update_with_backtracking(
      GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(1), cfg
  )
  assert not rec["accepted"] and rec["tries"] == 1
  assert _leaves_equal(new.params, state.params)
  assert float(new.beta) == pytest.approx(0.05)
  # With step scaling every retry differs, and all of them run.
  cfg = dataclasses.replace(cfg, backtrack_step_scale=0.5)
  _, rec, _ = trust_region.update_with_backtracking(
      GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(1), cfg
  )
  assert not rec["accepted"] and rec["tries"] == 4


def test_zero_beta_backtracking_without_step_scaling_is_refused():
  # beta_raise * 0 = 0: the retries could not differ from the first try.
  with pytest.raises(ValueError, match="beta_init=0 for agent 1"):
    _cfg(beta_init=(0.05, 0.0), delta=0.01, max_backtracks=2)
  with pytest.raises(ValueError, match="beta_init=0 for agent 0"):
    _cfg(beta_init=0.0, delta=0.01)
  # Accepted: no trust region, no retries, step scaling, or an agent whose
  # zero beta goes with an infinite delta.
  _cfg(beta_init=0.0, delta=float("inf"))
  _cfg(beta_init=0.0, delta=0.01, max_backtracks=0)
  _cfg(beta_init=0.0, delta=0.01, backtrack_step_scale=0.5)
  _cfg(beta_init=(0.05, 0.0), delta=(0.01, float("inf")))
  with pytest.raises(ValueError, match="beta_max"):
    _cfg(beta_init=(0.05, 2.0), beta_max=1.0)


class _NanKL(tabular.TabularAgent):
  """A broken agent: its KL is NaN wherever the policy moved."""

  def state_kl(self, params_new, params_old, inputs):
    kl = super().state_kl(params_new, params_old, inputs)
    return jnp.where(kl > 0, jnp.nan, kl)


def test_a_nan_kl_is_a_violation_and_beta_is_capped():
  cfg = _cfg(delta=1.0, max_backtracks=2, beta_max=0.06)
  state, view, adv = _setup(cfg)
  agent = _NanKL(1, 3)
  new, rec, _ = trust_region.update_with_backtracking(
      agent, state, view, adv.adv_E, adv.c_E, jax.random.key(0), cfg
  )
  assert not rec["accepted"] and np.isnan(float(rec["kl_quantile"]))
  assert _leaves_equal(new.params, state.params)
  assert float(new.beta) == pytest.approx(0.06)  # 0.05 * 1.5^3, capped


class _OneNanKL(tabular.TabularAgent):
  """A broken agent: its KL is NaN at one of its 32 measured states."""

  def state_kl(self, params_new, params_old, inputs):
    kl = super().state_kl(params_new, params_old, inputs)
    return kl.at[0, 0].set(jnp.nan)


def test_one_nan_kl_is_a_violation_below_the_quantile_too():
  # The 0.9-quantile of 32 states is the 29th smallest: a single NaN, sorted
  # last, would not reach it, yet the update must not pass.
  cfg = dataclasses.replace(
      _cfg(delta=10.0, max_backtracks=0),
      update=dataclasses.replace(_cfg().update, quantile=0.9),
  )
  state, view, adv = _setup(cfg)
  assert int(np.sum(np.asarray(view.mask_ExT))) == 32
  args = (state, view, adv.adv_E, adv.c_E, jax.random.key(0), cfg)
  _, rec, _ = trust_region.update_with_backtracking(_OneNanKL(1, 3), *args)
  assert np.isfinite(float(rec["kl_quantile"])) and not rec["accepted"]
  _, rec, _ = trust_region.update_with_backtracking(GAME.agents[0], *args)
  assert rec["accepted"]  # the same update with a finite KL passes


def test_returned_log_ratio_is_that_of_the_kept_params():
  for delta, accepted in ((1e-12, False), (1e3, True)):
    cfg = _cfg(delta=delta, max_backtracks=1)
    state, view, adv = _setup(cfg)
    new, rec, u_E = trust_region.update_with_backtracking(
        GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(1), cfg
    )
    assert bool(rec["accepted"]) == accepted
    expected = objective.sequence_logratio(GAME.agents[0], new.params, view)
    np.testing.assert_allclose(np.asarray(u_E), np.asarray(expected), atol=1e-6)
    if accepted:
      assert np.max(np.abs(np.asarray(u_E))) > 1e-4  # the params moved


def test_infinite_delta_skips_the_monitor_unless_a_certificate_needs_it():
  kept = {}
  for certificate in (None, C.CertificateConfig()):
    cfg = _cfg(delta=float("inf"), max_backtracks=2, certificate=certificate)
    state, view, adv = _setup(cfg)
    new, rec, u_E = trust_region.update_with_backtracking(
        GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(2), cfg
    )
    assert rec["accepted"] and rec["tries"] == 1
    assert ("kl_quantile" in rec) == (certificate is not None)
    kept[certificate is None] = (new.params, u_E)
  # The same update either way: the monitor only measures.
  assert _leaves_equal(kept[True][0], kept[False][0])
  np.testing.assert_allclose(
      np.asarray(kept[True][1]), np.asarray(kept[False][1]), atol=1e-6
  )
  # A finite delta that the same update violates is enforced (able to fail).
  cfg = _cfg(delta=1e-12, max_backtracks=0, certificate=None)
  state, view, adv = _setup(cfg)
  _, rec, _ = trust_region.update_with_backtracking(
      GAME.agents[0], state, view, adv.adv_E, adv.c_E, jax.random.key(2), cfg
  )
  assert not rec["accepted"]


def test_unread_log_ratio_skips_the_pass_over_the_new_params():
  """need_logratio=False without a monitor: the same update, no u_E and no
  new-params metrics; with a monitor (finite delta) the pass still runs."""

  def update(delta, need_logratio):
    cfg = _cfg(delta=delta, max_backtracks=0, certificate=None)
    state, view, adv = _setup(cfg)
    return trust_region.update_with_backtracking(
        GAME.agents[0],
        state,
        view,
        adv.adv_E,
        adv.c_E,
        jax.random.key(3),
        cfg,
        need_logratio=need_logratio,
    )

  new_t, rec_t, u_t = update(float("inf"), True)
  new_f, rec_f, u_f = update(float("inf"), False)
  assert _leaves_equal(new_t.params, new_f.params)
  assert _leaves_equal(new_t.opt_state, new_f.opt_state)
  assert u_f is None and u_t is not None
  assert "surrogate_gain" in rec_t and "surrogate_gain" not in rec_f
  assert "clip_fraction" not in rec_f and rec_f["accepted"]
  np.testing.assert_allclose(
      float(rec_f["grad_norm"]), float(rec_t["grad_norm"])
  )
  _, rec, u_E = update(1e3, False)
  assert u_E is not None and "kl_quantile" in rec


def test_update_agent_refuses_a_monitor_without_the_measuring_pass():
  cfg = _cfg(delta=1.0)
  state, view, adv = _setup(cfg)
  with pytest.raises(ValueError, match="measure_new"):
    objective.update_agent(
        GAME.agents[0],
        cfg.update,
        state.params,
        state.opt_state,
        state.params,
        0.0,
        1.0,
        1.0,
        view,
        adv.adv_E,
        adv.c_E,
        jax.random.key(0),
        monitor=True,
        measure_new=False,
    )
