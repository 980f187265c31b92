"""LM agents through the SAT core's stage loop, unchanged, in every method.

Three tiny Qwen3 agents in a one-round relay (E = 4 episodes); the update
compiles once (same agent, same UpdateConfig, same view shape) for all the
methods below.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from sat_jax import core
from sat_jax import models
from sat_jax import testing
from sat_jax.core import agent as agent_lib
from sat_jax.core import objective
from sat_jax.core import stage
from sat_jax.tasks import base
from sat_jax.team import lm_agent
from sat_jax.team import protocols
from sat_jax.team import rollout

PROTOCOL = protocols.ProtocolConfig(
    max_new_tokens=8,
    prompt_buckets=(504,),
    view_buckets=(128,),
    min_rows=4,
)
AGENTS = tuple(
    lm_agent.LMAgent(testing.tiny_config("qwen3"), 0.8) for _ in range(3)
)
UPDATE = core.UpdateConfig(
    epochs=2, optimizer=core.OptimizerConfig(learning_rate=3e-3)
)


class DigitTask(base.Task):
  """Graded toy reward: the fraction of digits in the message."""

  name = "digits"

  def load(self, split):
    return [base.Example(f"d{i}", f"Say {i}{i}.", str(i)) for i in range(4)]

  def extract_answer(self, text):
    return text or None

  def check(self, example, answer):
    frac = sum(c.isdigit() for c in answer) / len(answer)
    return base.Verdict(frac, frac > 0.2, answer)


@pytest.fixture(scope="module")
def rollout_fn(tmp_path_factory):
  tok = transformers.AutoTokenizer.from_pretrained(
      str(testing.build_tiny_tokenizer(tmp_path_factory.mktemp("tok")))
  )
  task = DigitTask()
  return rollout.make_rollout_fn(
      AGENTS,
      [tok] * 3,
      task,
      task.load("train"),
      PROTOCOL,
      num_prompts=2,
      group_size=2,
  )


def _run(rollout_fn, **kwargs):
  cfg = core.SATConfig(update=UPDATE, **kwargs)
  params = [
      models.init_params(a.config, jax.random.key(k))
      for k, a in enumerate(AGENTS)
  ]
  team = core.init_team(AGENTS, params, cfg)
  rollout_fn.pop_results()
  new_team, record = stage.run_stage(
      AGENTS, team, rollout_fn, cfg, jax.random.key(7)
  )
  return team, new_team, record, rollout_fn.pop_results()


@functools.partial(jax.jit, static_argnums=0)
def _u(agent, params, view):
  """u(tau): sum over the agent's tokens of log pi - log pi_behaviour."""
  logp = agent.token_logprobs(params, view.inputs)
  diff = jnp.where(view.mask_ExT, logp - view.behaviour_logp_ExT, 0.0)
  return jnp.sum(diff, axis=1)


def _same(a, b) -> bool:
  return all(
      np.array_equal(x, y)
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def test_reuse_weights_later_agents_by_the_earlier_updates(rollout_fn):
  start, team, record, results = _run(rollout_fn, delta=10.0)
  assert len(results) == 1 and record.order == (0, 1, 2)
  steps = record.steps
  assert all(s["accepted"] for s in steps)
  batch = results[0].batch
  # c(tau) = min(1, exp(sum of the already-updated agents' u_k(tau))).
  log_rho = np.zeros(4)
  for i, j in enumerate(record.order):
    c = np.minimum(1.0, np.exp(log_rho))
    assert steps[i]["agent"] == j
    np.testing.assert_allclose(steps[i]["mean_c"], c.mean(), atol=1e-5)
    np.testing.assert_allclose(steps[i]["min_c"], c.min(), atol=1e-5)
    log_rho += np.asarray(_u(AGENTS[j], team[j].params, batch.views[j]))
  assert steps[1]["min_c"] < 1.0  # the weights really moved
  for old, new in zip(start, team):
    assert not _same(old.params, new.params)


def test_a_rejected_update_leaves_the_params_bitwise_unchanged(rollout_fn):
  start, team, record, _ = _run(rollout_fn, delta=1e-12, max_backtracks=0)
  assert not any(s["accepted"] for s in record.steps)
  for old, new in zip(start, team):
    assert _same(old.params, new.params)
    assert _same(old.opt_state, new.opt_state)


def test_resample_draws_fresh_episodes_for_every_agent_step(rollout_fn):
  _, _, record, results = _run(
      rollout_fn, delta=10.0, advantage_mode="resample"
  )
  assert len(results) == 3  # one rollout per agent step
  assert all(s["mean_c"] == 1.0 for s in record.steps)
  first, second = (r.batch.views[0].inputs["tokens_ExT"] for r in results[:2])
  assert not np.array_equal(first, second)


def test_joint_updates_everyone_from_the_stage_start_batch(rollout_fn):
  start, team, record, results = _run(rollout_fn, delta=10.0, method="joint")
  assert len(results) == 1 and record.certificate is None
  assert all(s["mean_c"] == 1.0 and s["accepted"] for s in record.steps)
  for old, new in zip(start, team):
    assert not _same(old.params, new.params)


def test_single_trains_only_its_agent(rollout_fn):
  start, team, record, _ = _run(
      rollout_fn, delta=10.0, method="single", single_agent=1
  )
  assert [s["agent"] for s in record.steps] == [1]
  assert not _same(start[1].params, team[1].params)
  assert _same(start[0].params, team[0].params)
  assert _same(start[2].params, team[2].params)


@functools.partial(jax.jit, static_argnums=0)
def _token_surrogate_grad_norm(agent, params, view, adv_E):
  """||grad of sum_{e,t own} A_e log pi(a_t|s_t) / #own tokens|| (at r = 1)."""

  def objective(p):
    logp = agent.token_logprobs(p, view.inputs)
    weighted = jnp.where(view.mask_ExT, adv_E[:, None] * logp, 0.0)
    return jnp.sum(weighted) / jnp.sum(view.mask_ExT)

  grads = jax.grad(objective)(params)
  return jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grads)))


@pytest.mark.slow
def test_greedy_order_with_token_ratios_sorts_by_gradient_norm(rollout_fn):
  update = core.UpdateConfig(
      ratio_mode="token", epochs=2, optimizer=UPDATE.optimizer
  )
  cfg = core.SATConfig(update=update, order="greedy", delta=10.0)
  params = [
      models.init_params(a.config, jax.random.key(k))
      for k, a in enumerate(AGENTS)
  ]
  # A near-zero final norm flattens agent 0's policy and its gradient, so
  # greedy must move it from first (static) to last.
  params[0] = dict(params[0], final_norm=params[0]["final_norm"] * 0.01)
  team = core.init_team(AGENTS, params, cfg)
  rollout_fn.pop_results()
  _, record = stage.run_stage(AGENTS, team, rollout_fn, cfg, jax.random.key(7))
  (result,) = rollout_fn.pop_results()
  batch = result.batch
  # The group z-score of the reward, by hand (groups of 2: +-1 or 0).
  reward = np.asarray(batch.reward_E).reshape(2, 2)
  mean, std = reward.mean(axis=1, keepdims=True), reward.std(
      axis=1, keepdims=True
  )
  adv = ((reward - mean) / (std + cfg.std_eps)).reshape(4).astype(np.float32)
  norms = [
      float(_token_surrogate_grad_norm(a, p, v, adv))
      for a, p, v in zip(AGENTS, params, batch.views)
  ]
  assert record.order[-1] == 0
  assert record.order == tuple(int(i) for i in np.argsort(norms)[::-1])
  assert all(s["accepted"] for s in record.steps)


def test_the_kl_reference_computed_once_gives_the_per_step_update(rollout_fn):
  # The core computes the old params' hidden states once per try
  # (`kl_reference`) and slices them per minibatch; an agent without
  # `kl_reference` runs the old body in every step. Same update, same
  # monitor. Two minibatches of a random permutation: a reference sliced
  # wrongly would pair episodes with another episode's old states.
  @dataclasses.dataclass(frozen=True)
  class PassPerStep(lm_agent.LMAgent):
    kl_reference = None

  agent = AGENTS[1]
  params = models.init_params(agent.config, jax.random.key(1))
  rollout_fn.pop_results()
  view = rollout_fn(
      [models.init_params(a.config, jax.random.key(k)) for k, a in
       enumerate(AGENTS)],
      jax.random.key(3),
  ).views[1]  # fmt: skip
  rollout_fn.pop_results()
  e = view.mask_ExT.shape[0]
  reference = agent.kl_reference(params, view.inputs)
  a = view.inputs["positions_ExA"].shape[1]
  assert reference.shape == (e, a, agent.config.hidden_size)
  cfg = dataclasses.replace(UPDATE, minibatches=2)
  adv_E = jnp.asarray([1.0, -1.0, 0.5, -0.5])
  tx = agent_lib.make_optimizer(cfg.optimizer)

  def update(agent, beta, kl_penalty=True):
    return objective.update_agent(
        agent, cfg, params, tx.init(params), params, jnp.float32(beta),
        jnp.float32(1.0), jnp.float32(0.05), view, adv_E, jnp.ones(e),
        jax.random.key(5), kl_penalty=kl_penalty,
    )  # fmt: skip

  got_params, _, got, _ = update(agent, 5.0)
  ref_params, _, ref, _ = update(PassPerStep(agent.config, 0.8), 5.0)
  jax.tree.map(
      lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
      got_params,
      ref_params,
  )
  for name in ("kl_quantile", "kl_mean", "kl_max", "surrogate_gain"):
    np.testing.assert_allclose(got[name], ref[name], rtol=1e-4, atol=1e-7)
  assert float(got["kl_mean"]) > 1e-6
  # The KL term moves the update: a wrong reference could not go unseen.
  no_kl_params = update(agent, 0.0, kl_penalty=False)[0]
  assert (
      max(
          float(jnp.max(jnp.abs(x - y)))
          for x, y in zip(
              jax.tree.leaves(no_kl_params), jax.tree.leaves(got_params)
          )
      )
      > 1e-4
  )
