"""The per-agent trust region: quantile-KL monitor, backtracking, rejection.

Each try runs the jitted `update_agent` from the *kept* pre-update state (its
params and optimizer state are never donated or mutated), so restoring is
exact: the next try starts from the same arrays, bitwise, with the same
minibatch order (the same key), so that a retry differs from the previous
try only through beta and the step scale. After a violating try,
beta_j <- min(beta_j * beta_raise, beta_max) and, if `backtrack_step_scale`
< 1, the step is scaled by it (step halving at 0.5). Because the exact KL has
zero gradient at the restored point, raising beta only changes a try with
more than one inner step; SATConfig rejects the settings where it could not
(a single step, or beta_init = 0, without step scaling). A retry that would
repeat the try before it bitwise (beta already at beta_max, no step
scaling) is not run: the update is rejected at once.
With Adam, raising beta does not reliably shrink the step (Adam normalises
the gradient scale); step halving does, so use it for small radii.

If all 1 + max_backtracks tries violate, the update is rejected: the agent
keeps its pre-update params and optimizer state (the very same arrays); a
violating update is never kept. beta follows config.py's rule. A try with
beta = 0 runs the update compiled without the KL term (`update_agent`'s
`kl_penalty`), which computes the same loss. delta = inf means no trust
region: with no certificate to feed, the KL monitor is skipped (every try
is accepted and the record has no kl_* entries).
"""

import math
from typing import Any

import jax
import numpy as np

from sat_jax import multihost
from sat_jax.core import agent as agent_lib
from sat_jax.core import batch as batch_lib
from sat_jax.core import config as config_lib
from sat_jax.core import objective

Metrics = dict[str, Any]


def update_with_backtracking(
    agent: agent_lib.Agent,
    state: agent_lib.AgentState,
    view: batch_lib.AgentView,
    adv_E: jax.Array,
    c_E: jax.Array,
    key: jax.Array,
    cfg: config_lib.SATConfig,
    *,
    beta_init: float | None = None,
    need_logratio: bool = True,
) -> tuple[agent_lib.AgentState, Metrics, jax.Array | None]:
  """Tries the update until the KL quantile is within delta, or rejects it.

  Returns the new state, a flat dict of (device) scalars: accepted, tries,
  beta (of the last try), the last try's monitor metrics, the first try's
  violation rate, and num_states / num_own_episodes of the agent; and u_E,
  the kept params' per-episode sequence log-ratio (`sequence_logratio`).
  With `need_logratio=False` and no monitor (delta = inf, no certificate)
  nothing measures the new params: u_E is None and the record has no
  surrogate_gain / clip_fraction (`update_agent`'s `measure_new`).
  `beta_init` is this agent's start value, the floor of beta's decay
  (`cfg.beta_init` when it is one value for every agent).
  """
  if beta_init is None:
    if isinstance(cfg.beta_init, tuple):
      raise ValueError(
          f"beta_init={cfg.beta_init} is per agent: pass this agent's"
      )
    beta_init = cfg.beta_init
  beta, delta = map(float, multihost.to_host((state.beta, state.delta)))
  monitor = math.isfinite(delta) or cfg.certificate is not None
  measure_new = monitor or need_logratio
  step_scale = 1.0
  first_violation_rate = None
  for attempt in range(cfg.max_backtracks + 1):
    last_beta = beta
    params, opt_state, metrics, u_E = objective.update_agent(
        agent,
        cfg.update,
        state.params,
        state.opt_state,
        state.params,  # the KL reference: this agent's stage-start params
        agent_lib.scalar(beta),
        agent_lib.scalar(step_scale),
        state.delta,
        view,
        adv_E,
        c_E,
        key,
        kl_penalty=beta > 0,
        monitor=monitor,
        measure_new=measure_new,
    )
    if first_violation_rate is None:
      first_violation_rate = metrics.get("violation_rate", 0.0)
    # The one device scalar the host reads per try.
    accepted = not bool(multihost.to_host(metrics.pop("violated")))
    if accepted:
      break
    next_beta = min(beta * cfg.beta_raise, cfg.beta_max)
    # The update reads beta as float32: equal there, the retry would repeat
    # this try bitwise, so the update is rejected now.
    if np.float32(next_beta) == np.float32(beta) and (
        cfg.backtrack_step_scale == 1.0
    ):
      break
    beta = next_beta
    step_scale *= cfg.backtrack_step_scale
  tries = attempt + 1
  record = dict(
      metrics,
      accepted=accepted,
      tries=tries,
      first_violation_rate=first_violation_rate,
  )
  if accepted:
    record["beta"] = beta
    if tries == 1:
      beta = max(beta_init, beta / cfg.beta_decay)
    new_state = state.replace(
        params=params, opt_state=opt_state, beta=agent_lib.scalar(beta)
    )
  else:
    record["beta"] = last_beta
    record["surrogate_gain"] = 0.0
    new_state = state.replace(beta=agent_lib.scalar(beta))
    if measure_new:
      u_E = objective.sequence_logratio(agent, state.params, view)
  return new_state, record, u_E
