"""The stage loop: compile once, baselines on the same path, early errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax.core import advantage
from sat_jax.core import agent as agent_lib
from sat_jax.core import config as C
from sat_jax.core import objective
from sat_jax.core import stage
from sat_jax.core import tracing
from sat_jax.core import trust_region
from sat_jax.toy import games
from sat_jax.toy import tabular

STEP_KEYS = {
    "accepted",
    "tries",
    "beta",
    "kl_quantile",
    "violation_rate",
    "surrogate_gain",
    "mean_c",
    "min_c",
    "num_states",
    "num_own_episodes",
    "grad_norm",
    "clip_fraction",
    "agent",
    "position",
    "gain",
    "bias",
}


def _cfg(game, lr=0.05, **kw):
  update = C.UpdateConfig(
      epochs=2,
      minibatches=2,
      optimizer=C.OptimizerConfig("adamw", lr, weight_decay=0.0),
  )
  kw.setdefault(
      "certificate",
      C.CertificateConfig(
          reward_bounds=game.reward_bounds, horizon=game.horizon
      ),
  )
  return C.SATConfig(update=update, beta_init=0.01, **kw)


def _run(game, cfg, stages=1, seed=0, groups=4, size=4, logits=None):
  team = agent_lib.init_team(game.agents, game.init_params(logits), cfg)
  rollout = game.rollout_fn(groups, size)
  records = []
  for k in range(stages):
    team, record = stage.run_stage(
        game.agents, team, rollout, cfg, jax.random.key(1000 * seed + k)
    )
    records.append(record)
  return team, records


def _equal(a, b):
  return all(
      np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def test_compiles_once_across_stages_and_same_shaped_agents():
  rng = np.random.default_rng(0)
  game = games.matrix_game(rng.normal(size=(2, 2, 2)))  # 3 agents, 2 actions
  cfg = _cfg(game, lr=0.0123, delta=1e-3)  # a fresh static config
  before = tracing.trace_counts()
  _, records = _run(game, cfg, stages=3)
  assert sum(s["tries"] for r in records for s in r.steps) > 9  # retries ran
  after = tracing.trace_counts()
  for name in ("update_agent", "step_statistics"):
    assert after[name] - before.get(name, 0) == 1, name
  # Only a rejected update needs its own log-ratio pass (at the kept params).
  assert (
      after.get("sequence_logratio", 0) - before.get("sequence_logratio", 0)
      <= 1
  )
  # Two new agent shapes -> exactly two more compiled updates.
  other = games.matrix_game(rng.normal(size=(2, 3)))
  _run(other, _cfg(other, lr=0.0123, delta=1e-3), stages=2)
  assert tracing.trace_counts()["update_agent"] - after["update_agent"] == 2


def test_batch_behaviour_log_probs_match_the_agents():
  game = games.sequential_climbing_game()
  params = game.init_params([np.random.default_rng(1).normal(size=(3, 3))] * 2)
  batch = game.rollout_fn(4, 4)(params, jax.random.key(0))
  for agent, p, view in zip(game.agents, params, batch.views):
    assert np.all(np.asarray(objective.sequence_logratio(agent, p, view)) == 0)
    assert np.all(np.asarray(agent.state_kl(p, p, view.inputs)) == 0)


def test_records_and_certificate():
  game = games.climbing_game()
  _, (record,) = _run(game, _cfg(game))
  assert record.order == (0, 1)
  assert [s["agent"] for s in record.steps] == [0, 1]
  for step in record.steps:
    assert STEP_KEYS <= set(step)
    assert all(isinstance(v, (bool, int, float)) for v in step.values())
  assert set(record.certificate) >= {
      "gain",
      "shift",
      "bias",
      "finite_sample",
      "lower_bound",
  }


def test_none_leaves_the_team_untouched():
  game = games.climbing_game()
  cfg = _cfg(game, method="none")
  team = agent_lib.init_team(game.agents, game.init_params(), cfg)
  new, record = stage.run_stage(
      game.agents, team, game.rollout_fn(4, 4), cfg, jax.random.key(0)
  )
  assert new is team and record.steps == () and record.certificate is None


def test_single_trains_one_agent_only():
  game = games.matrix_game(np.random.default_rng(2).normal(size=(3, 3, 3)))
  cfg = _cfg(game, method="single", single_agent=1, delta=1.0)
  team0 = agent_lib.init_team(game.agents, game.init_params(), cfg)
  team, (record,) = _run(game, cfg)
  assert record.order == (1,)
  assert _equal(team[0].params, team0[0].params)
  assert _equal(team[2].params, team0[2].params)
  assert not _equal(team[1].params, team0[1].params)


def test_joint_updates_every_agent_from_the_stage_start_batch():
  game = games.climbing_game()
  logits = [np.random.default_rng(3).normal(size=(1, 3))] * 2
  cfg = _cfg(game, method="joint", delta=1.0)
  team0 = agent_lib.init_team(game.agents, game.init_params(logits), cfg)
  key = jax.random.key(7)
  team, record = stage.run_stage(
      game.agents, team0, game.rollout_fn(4, 4), cfg, key
  )
  assert all(s["min_c"] == 1.0 for s in record.steps)
  assert record.certificate is None
  # Agent 1's joint update is the update of agent 1 alone on the stage-start
  # batch (c = 1), whatever agent 0 did.
  k_roll, _, k_upd = jax.random.split(key, 3)
  batch = game.rollout_fn(4, 4)(
      agent_lib.team_params(team0), jax.random.split(k_roll, 2)[0]
  )
  adv = advantage.sequence_advantages(
      batch.reward_E,
      batch.group_E,
      jnp.zeros(16),
      num_groups=4,
      a_clip=5.0,
      std_eps=1e-6,
  )
  alone, _, _ = trust_region.update_with_backtracking(
      game.agents[1],
      team0[1],
      batch.views[1],
      adv.adv_E,
      adv.c_E,
      jax.random.split(k_upd, 2)[1],
      cfg,
  )
  assert _equal(team[1].params, alone.params)
  # SAT (reuse) instead reweights agent 1's data by agent 0's update.
  sat_team, sat_record = stage.run_stage(
      game.agents, team0, game.rollout_fn(4, 4), _cfg(game, delta=1.0), key
  )
  assert sat_record.steps[0]["accepted"] and sat_record.steps[1]["min_c"] < 1
  assert not _equal(sat_team[1].params, alone.params)


def test_resample_rolls_out_before_every_step():
  game = games.matrix_game(np.random.default_rng(4).normal(size=(2, 2, 2)))
  calls = []
  rollout = game.rollout_fn(4, 4)

  def counting(params, key):
    calls.append(key)
    return rollout(params, key)

  for mode, expected in (("reuse", 1), ("resample", 3)):
    calls.clear()
    cfg = _cfg(game, advantage_mode=mode)
    team = agent_lib.init_team(game.agents, game.init_params(), cfg)
    _, record = stage.run_stage(
        game.agents, team, counting, cfg, jax.random.key(0)
    )
    assert len(calls) == expected
    assert all(s["min_c"] == 1.0 for s in record.steps) == (mode == "resample")


def test_bad_batch_fails_before_any_update(monkeypatch):
  game = games.climbing_game()
  cfg = _cfg(game)
  team = agent_lib.init_team(game.agents, game.init_params(), cfg)

  def forbidden(*args, **kwargs):
    raise AssertionError("an update ran")

  monkeypatch.setattr(trust_region, "update_with_backtracking", forbidden)
  one_group = game.rollout_fn(1, 4)
  bad = lambda p, k: one_group(p, k).replace(
      group_E=jnp.array([0, 0, 0, 1]), num_groups=2
  )
  with pytest.raises(ValueError, match="group 1 has 1 episode"):
    stage.run_stage(game.agents, team, bad, cfg, jax.random.key(0))
  with pytest.raises(ValueError, match="2 agents for a team state of 1"):
    stage.run_stage(game.agents, team[:1], one_group, cfg, jax.random.key(0))
  with pytest.raises(ValueError, match="not a permutation of the 2"):
    stage.run_stage(
        game.agents,
        team,
        one_group,
        _cfg(game, order=(0, 1, 2)),
        jax.random.key(0),
    )


def test_a_stage_makes_no_implicit_host_transfer():
  game = games.sequential_climbing_game()
  cfg = _cfg(game, order="random", delta=1e-3)
  team = agent_lib.init_team(game.agents, game.init_params(), cfg)
  rollout = game.rollout_fn(4, 4)
  k0, k1 = jax.random.split(jax.random.key(0), 2)
  stage.run_stage(game.agents, team, rollout, cfg, k0)  # compile
  with jax.transfer_guard("disallow"):
    _, record = stage.run_stage(game.agents, team, rollout, cfg, k1)
  assert len(record.steps) == 2


def test_the_last_reuse_step_skips_the_unread_log_ratio(monkeypatch):
  """No trust region, no certificate, reuse: only the stage's last agent's
  u_E is unread, so only its update skips the pass over the new params;
  the team ends the same as when every u_E is computed."""
  game = games.matrix_game(np.random.default_rng(4).normal(size=(3, 3, 3)))
  cfg = _cfg(game, delta=float("inf"), certificate=None, order=(2, 0, 1))
  team, (record,) = _run(game, cfg, stages=1)
  assert [("surrogate_gain" in s) for s in record.steps] == [True, True, False]
  real = trust_region.update_with_backtracking

  def always_measure(*args, need_logratio, **kw):
    del need_logratio
    return real(*args, need_logratio=True, **kw)

  monkeypatch.setattr(trust_region, "update_with_backtracking", always_measure)
  team_all, (record_all,) = _run(game, cfg, stages=1)
  assert all("surrogate_gain" in s for s in record_all.steps)
  assert _equal(team, team_all)


def test_agents_are_checked_with_a_named_error():
  table = tabular.TabularAgent(num_states=2, num_actions=3)
  agent_lib.check_agents([table])  # a valid agent passes

  class Unhashable:
    __hash__ = None
    token_logprobs = state_kl = lambda *a: None

  with pytest.raises(TypeError, match="agent 0 .Unhashable. is not hashable"):
    agent_lib.check_agents([Unhashable()])
  with pytest.raises(TypeError, match="agent 1 .object. lacks token_logprobs"):
    agent_lib.check_agents([table, object()])

  # A reference for the KL is passed to logprobs_and_kl(..., reference=).
  @dataclasses.dataclass(frozen=True)
  class ReferenceOnly(tabular.TabularAgent):
    kl_reference = lambda self, params_old, inputs: params_old

  with pytest.raises(TypeError, match="kl_reference without logprobs_and_kl"):
    agent_lib.check_agents([ReferenceOnly(num_states=2, num_actions=3)])
