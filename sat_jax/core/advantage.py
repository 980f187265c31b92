"""Sequence-aware group advantages with truncated importance weights.

One jitted function computes, per episode tau of a batch drawn at stage
start under pi_cur, for the step that updates agent sigma(i):

  rho(tau) = exp(sum_{k in sigma(1..i-1)} u_k(tau)),
  u_k(tau) = sum_{t in T_k(tau)} log pi_k^tar(a_t|s_t) - log pi_k^beh(a_t|s_t),
  c(tau)   = min(1, rho(tau))                    (truncated weight),
  mu_g     = sum_{tau in g} c R / sum_{tau in g} c,
  sigma_g^2 = sum_{tau in g} c (R - mu_g)^2 / sum_{tau in g} c,
  A(tau)   = clip((R(tau) - mu_g) / (sigma_g + std_eps), -A_clip, A_clip).

The caller passes log rho (the sum of the already-updated agents' own-token
log-ratios against the stage-start behaviour log-probs); mode `reuse` passes
the running sum, mode `resample` (fresh episodes under the intermediate team)
and the baselines pass zeros, so that c = 1 and the statistics are the plain
group z-score. A group whose rewards are all equal gets A = 0 exactly (not
rounding noise divided by std_eps). The advantage is the episode's: there is
no critic, R is the episode return (GRPO-style, as the public code's default;
the paper's GAE needs a value model it never describes).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from sat_jax.core import tracing

_LOG_RHO_CAP = 30.0  # exp(30) ~ 1e13: rho beyond it only feeds diagnostics


class Advantages(NamedTuple):
  adv_E: jax.Array  # clipped group z-score of the reward
  c_E: jax.Array  # truncated weight min(1, rho); also the loss weight
  rho_E: jax.Array  # the untruncated weight (for bias diagnostics)


@functools.partial(jax.jit, static_argnames=("num_groups", "a_clip", "std_eps"))
def sequence_advantages(
    reward_E: jax.Array,
    group_E: jax.Array,
    log_rho_E: jax.Array,
    *,
    num_groups: int,
    a_clip: float,
    std_eps: float,
) -> Advantages:
  """c-weighted group z-score of the reward (equations in the module doc)."""
  tracing.count_trace("sequence_advantages")
  log_rho_E = jnp.minimum(log_rho_E, _LOG_RHO_CAP)
  c_E = jnp.exp(jnp.minimum(log_rho_E, 0.0))
  seg = functools.partial(
      jax.ops.segment_sum, segment_ids=group_E, num_segments=num_groups
  )
  # Sums (and max/min) that share a pass are stacked so that each group
  # reduction is one scatter.
  sums_Px2 = seg(jnp.stack([c_E, c_E * reward_E], axis=1))
  weight_P = jnp.maximum(sums_Px2[:, 0], jnp.finfo(jnp.float32).tiny)
  mean_P = sums_Px2[:, 1] / weight_P
  dev_E = reward_E - mean_P[group_E]
  std_P = jnp.sqrt(seg(c_E * dev_E * dev_E) / weight_P)
  extreme_Px2 = jax.ops.segment_max(
      jnp.stack([reward_E, -reward_E], axis=1),
      group_E,
      num_segments=num_groups,
  )
  spread_P = extreme_Px2[:, 0] + extreme_Px2[:, 1]
  z_E = dev_E / (std_P[group_E] + std_eps)
  adv_E = jnp.where(spread_P[group_E] > 0, jnp.clip(z_E, -a_clip, a_clip), 0.0)
  return Advantages(adv_E=adv_E, c_E=c_E, rho_E=jnp.exp(log_rho_E))


def compiled_hlo(
    num_episodes: int,
    num_groups: int,
    a_clip: float = 5.0,
    std_eps: float = 1e-6,
) -> str:
  """The optimised HLO text of `sequence_advantages` for E and P given."""
  reward = jax.ShapeDtypeStruct((num_episodes,), jnp.float32)
  group = jax.ShapeDtypeStruct((num_episodes,), jnp.int32)
  lowered = sequence_advantages.lower(
      reward,
      group,
      reward,
      num_groups=num_groups,
      a_clip=a_clip,
      std_eps=std_eps,
  )
  return lowered.compile().as_text()
