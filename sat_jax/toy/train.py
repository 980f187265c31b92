"""Runs SAT (or a baseline) on a toy game and records exact returns.

Training uses sampled batches, as real training does; the exact J of the team
is computed after every stage and, for `sat`, after every agent step (the
intermediate teams pi_hat^i are rebuilt from the stage-start and stage-end
params and the order), so every per-stage or per-step claim can be checked
against the truth.
"""

import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from sat_jax.core import agent as agent_lib
from sat_jax.core import certificate as certificate_lib
from sat_jax.core import config as config_lib
from sat_jax.core import stage as stage_lib
from sat_jax.toy import games


@dataclasses.dataclass
class ToyRun:
  """Per-stage exact returns, records and certificates of one run."""

  returns: np.ndarray  # [K + 1]: J before stage 0, after each stage
  step_returns: list[list[float]]  # per stage: J(pi_hat^0..n) (sat only)
  records: list[stage_lib.StageRecord]
  bounds: dict[str, np.ndarray]  # variant -> stage lower bound [K]
  terms: dict[str, dict[str, np.ndarray]]  # variant -> term -> [K]
  sup_kl: list[list[float]]  # per stage, per step: exact sup_s KL of the step
  final_params: tuple[Any, ...]

  @property
  def improvements(self) -> np.ndarray:
    return np.diff(self.returns)


def _sup_kl(new, old) -> float:
  """max_s KL(softmax(new[s]) || softmax(old[s])), in float64."""
  p_new, p_old = games.softmax(jax.device_get(new)), games.softmax(
      jax.device_get(old)
  )
  return float(np.max(np.sum(p_new * np.log(p_new / p_old), axis=-1)))


def certificate_config(game, variant: str = "episodic", **kw):
  """The CertificateConfig of a game: its reward bounds and horizon."""
  return config_lib.CertificateConfig(
      variant=variant,
      reward_bounds=game.reward_bounds,
      horizon=game.horizon,
      **kw,
  )


def run_toy(
    game,
    cfg: config_lib.SATConfig,
    *,
    num_stages: int,
    seed: int,
    num_groups: int,
    group_size: int,
    init_logits: Sequence | None = None,
) -> ToyRun:
  """num_stages stages of cfg on `game` from init_logits (default uniform)."""
  params = game.init_params(init_logits)
  team = agent_lib.init_team(game.agents, params, cfg)
  rollout = game.rollout_fn(num_groups, group_size)
  returns = [game.exact_return(agent_lib.team_params(team))]
  step_returns, records, sup_kl = [], [], []
  bounds = {v: [] for v in config_lib.CERTIFICATE_VARIANTS}
  terms = {
      v: {t: [] for t in certificate_lib.TERMS}
      for v in config_lib.CERTIFICATE_VARIANTS
  }
  for stage_key in jax.random.split(jax.random.key(seed), num_stages):
    start = agent_lib.team_params(team)
    team, record = stage_lib.run_stage(
        game.agents, team, rollout, cfg, stage_key
    )
    end = agent_lib.team_params(team)
    returns.append(game.exact_return(end))
    records.append(record)
    steps_j, kl_j, current = [game.exact_return(start)], [], list(start)
    for step in record.steps:
      j = step["agent"]
      kl_j.append(_sup_kl(end[j], start[j]))
      if cfg.method == "sat":
        current[j] = end[j]
        steps_j.append(game.exact_return(current))
    step_returns.append(steps_j)
    sup_kl.append(kl_j)
    if record.certificate is not None:
      eps_max = max(cfg.update.epsilon, cfg.update.eps_high)
      for v in config_lib.CERTIFICATE_VARIANTS:
        c = certificate_lib.stage_bound(
            record.steps, cfg.certificate, len(team), eps_max, variant=v
        )
        bounds[v].append(c["lower_bound"])
        for t in certificate_lib.TERMS:
          terms[v][t].append(c[t])
  return ToyRun(
      returns=np.asarray(returns),
      step_returns=step_returns,
      records=records,
      bounds={v: np.asarray(b) for v, b in bounds.items()},
      terms={
          v: {t: np.asarray(x) for t, x in d.items()} for v, d in terms.items()
      },
      sup_kl=sup_kl,
      final_params=agent_lib.team_params(team),
  )
