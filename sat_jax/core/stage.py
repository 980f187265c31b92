"""One SAT stage (Algorithm 1), and the joint / single / none baselines.

`run_stage` is the one loop to read top to bottom. Host Python orders the
agents, accepts or rejects (one device scalar per try) and collects records;
everything else is a jitted phase: the caller's rollout, the advantages, the
agent update (one compiled function per agent architecture), the sequence
log-ratios and the certificate statistics.

Methods on the same path:
  sat     agents in order sigma, each under the intermediate team: `reuse`
          reweights the stage-start batch by c = min(1, rho) of the agents
          already updated; `resample` draws fresh episodes under the
          intermediate team before each step after the first (c = 1).
  joint   every agent updated from the stage-start batch and the stage-start
          team, c = 1, all applied at once (MAPPO/MAGRPO-style).
  single  only agent `single_agent` is trained (GRPO/DAPO on its positions).
  none    no update (the untrained team).
Each agent's update keeps its own trust region in every method. The
certificate is computed for `sat` and `single`; for `joint` it would not be a
bound (the simultaneous update has cross terms it does not cover).
"""

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from sat_jax import multihost
from sat_jax.core import advantage
from sat_jax.core import agent as agent_lib
from sat_jax.core import batch as batch_lib
from sat_jax.core import certificate as certificate_lib
from sat_jax.core import config as config_lib
from sat_jax.core import objective
from sat_jax.core import order as order_lib
from sat_jax.core import trust_region

PyTree = Any
# (params of every agent, key) -> TeamBatch; used at stage start and, in
# `resample` mode, before each agent step under the intermediate team.
RolloutFn = Callable[[tuple[PyTree, ...], jax.Array], batch_lib.TeamBatch]


@dataclasses.dataclass(frozen=True)
class StageRecord:
  """What one stage did: sigma, one flat scalar dict per agent step."""

  order: tuple[int, ...]
  steps: tuple[dict[str, Any], ...]  # in update order; step["agent"] = j
  certificate: dict[str, Any] | None
  mean_reward: float  # of the stage-start batch


def _advantages(batch, log_rho_E, cfg):
  return advantage.sequence_advantages(
      batch.reward_E,
      batch.group_E,
      log_rho_E,
      num_groups=batch.num_groups,
      a_clip=cfg.a_clip,
      std_eps=cfg.std_eps,
  )


def _zeros_like(x: jax.Array) -> jax.Array:
  """float32 zeros placed like x (an explicit transfer, x's sharding)."""
  return jax.device_put(np.zeros(x.shape, np.float32), x.sharding)


def _to_python(step: dict[str, Any]) -> dict[str, Any]:
  return {k: v.item() if hasattr(v, "item") else v for k, v in step.items()}


def _stage_order(agents, team, batch, cfg, key):
  if cfg.method == "joint":
    return tuple(range(len(team)))  # simultaneous: the order is immaterial
  if cfg.method == "single":
    return (cfg.single_agent,)
  gains = None
  if cfg.order == "greedy":
    adv = _advantages(batch, _zeros_like(batch.reward_E), cfg)
    gains = multihost.to_host([
        objective.surrogate_grad_norm(
            agents[j],
            cfg.update,
            team[j].params,
            batch.views[j],
            adv.adv_E,
            adv.c_E,
        )
        for j in range(len(team))
    ])
  return order_lib.order_agents(cfg.order, len(team), key, gains)


def run_stage(
    agents: tuple[agent_lib.Agent, ...],
    team: agent_lib.TeamState,
    rollout_fn: RolloutFn,
    cfg: config_lib.SATConfig,
    key: jax.Array,
) -> tuple[agent_lib.TeamState, StageRecord]:
  """Runs one stage; returns the new team state and the stage record."""
  num_agents = len(team)
  if len(agents) != num_agents:
    raise ValueError(f"{len(agents)} agents for a team state of {num_agents}")
  if cfg.method == "single" and cfg.single_agent >= num_agents:
    raise ValueError(
        f"single_agent={cfg.single_agent} exceeds the team of {num_agents}"
    )
  if isinstance(cfg.order, tuple):
    config_lib.check_permutation(cfg.order, num_agents)
  key_rollout, key_order, key_update = jax.random.split(key, 3)
  rollout_keys = tuple(jax.random.split(key_rollout, num_agents))
  update_keys = tuple(jax.random.split(key_update, num_agents))
  batch = rollout_fn(agent_lib.team_params(team), rollout_keys[0])
  batch_lib.validate_batch(batch, num_agents, cfg.update.minibatches)
  mean_reward = float(np.mean(multihost.to_host(batch.reward_E)))
  if cfg.method == "none":
    return team, StageRecord((), (), None, mean_reward)

  sigma = _stage_order(agents, team, batch, cfg, key_order)
  start, new_team = team, list(team)
  reuse = cfg.method == "sat" and cfg.advantage_mode == "reuse"
  log_rho_E = _zeros_like(batch.reward_E)
  steps = []
  for i, j in enumerate(sigma):
    if cfg.method == "sat" and cfg.advantage_mode == "resample" and i > 0:
      batch = rollout_fn(agent_lib.team_params(new_team), rollout_keys[i])
      batch_lib.validate_batch(batch, num_agents, cfg.update.minibatches)
    view = batch.views[j]
    adv = _advantages(batch, log_rho_E, cfg)
    state, record, u_E = trust_region.update_with_backtracking(
        agents[j],
        start[j],
        view,
        adv.adv_E,
        adv.c_E,
        update_keys[j],
        cfg,
        beta_init=cfg.agent_beta_inits(num_agents)[j],
        # Read by the certificate, or by the next agents' ratios (reuse).
        need_logratio=cfg.certificate is not None
        or (reuse and i < len(sigma) - 1),
    )
    if cfg.certificate is not None:
      lo, hi = cfg.certificate.reward_bounds
      record.update(
          certificate_lib.step_statistics(
              u_E,
              batch.reward_E,
              log_rho_E,
              baseline=0.5 * (lo + hi),
              epsilon=cfg.update.epsilon,
              epsilon_high=cfg.update.eps_high,
          )
      )
    if reuse and record["accepted"] and u_E is not None:
      log_rho_E = log_rho_E + u_E
    new_team[j] = state
    steps.append(dict(record, agent=j, position=i))

  steps = tuple(_to_python(s) for s in multihost.to_host(steps))
  cert = None
  if cfg.certificate is not None and cfg.method in ("sat", "single"):
    cert = certificate_lib.stage_bound(
        steps,
        cfg.certificate,
        num_agents,
        max(cfg.update.epsilon, cfg.update.eps_high),
    )
  return tuple(new_team), StageRecord(sigma, steps, cert, mean_reward)
