"""The per-stage improvement certificate: gain - shift - bias - finite sample.

Scale. Every term is in reward units, the units of J(pi_bar) - J(pi_cur):
the advantage used here is A(tau) = R(tau) - b with the constant baseline
b = (R_lo + R_hi) / 2 of the configured return bounds, so |A| <= A_max =
(R_hi - R_lo) / 2. It is *not* the group z-score the agent trains on (that
is unit-free and would make the comparison with the true improvement
meaningless), and b is a constant so that step 1 below is exact.

Episodic variant (derived here for H-step episodes; every inequality holds
pointwise or in expectation). Step i updates agent j. P_i is the law of an
episode under the intermediate team pi_hat^i, P_0 under pi_cur (the batch).

 1. r(tau) = P_i(tau) / P_{i-1}(tau) = exp(u_j(tau)): only j's factors
    differ, the environment and the other agents cancel. Since
    E_{P_{i-1}}[r] = 1, Delta_i = J(pi_hat^i) - J(pi_hat^{i-1})
    = E_{P_{i-1}}[(r - 1) A] exactly. The sequence ratio already reweights
    the state occupancy, so Lemma 4.1's first-order shift does not arise.
 2. Pessimism: (r - 1) A >= Z := min(r A, clip(r, 1-eps, 1+eps_hi) A) - A.
 3. Ratio cap (the occupancy-shift term). Z~ is Z with r capped at 2; then
    Z - Z~ >= -A_max (r - 2)_+, and E_{P_{i-1}}[(r - 2)_+] is at most
    kappa * KL(P_i || P_{i-1}) (because (r-2)_+ <= kappa (r log r - r + 1),
    kappa = 1 / min_{r>2} (r log r - r + 1)/(r - 2) = 0.796) and at most
    TV <= sqrt(KL / 2). By the chain rule KL(P_i || P_{i-1}) =
    E_{P_i} sum_{t in T_j} KL_j(s_t) <= H delta_max, so
      shift_i = A_max * min(kappa H d, sqrt(H d / 2), 1),  d = delta_hat_i,
    (H at least the most states j acted at in one episode of the batch: for
    an LM agent, its tokens, not its messages),
    with delta_hat_i = (1-alpha)-quantile KL + sqrt(log(2/eta) / (2 N_j)),
    the monitor's stand-in for sup_s KL with the DKW slack of PAPER.md
    §3.5, N_j the episodes in which agent j acts (the states it was
    measured at come from these; the paper's N_i counts episodes). Not
    the N_s states: those of one episode are not independent, and
    counting them would shrink the slack (by sqrt(tokens per episode)
    for an LM agent).
 4. Truncation (the estimator-bias term zeta_i). E_{P_{i-1}}[Z~] =
    E_{P_0}[rho Z~] = E_{P_0}[c Z~] + E_{P_0}[(rho - c) Z~], and the last
    term is >= -E_{P_0}[(rho - c) |Z~|]: bias_i is its sample mean.
 5. Finite sample. c Z~ lies in [-A_max, eps_max A_max]: by Hoeffding,
    simultaneously for the n steps w.p. >= 1 - delta_conf,
      E[c Z~] >= gain_i - W sqrt(log(2n / delta_conf) / (2 N_i)),
    gain_i = mean over the N_i episodes of c Z~, W = (1 + eps_max) A_max.
    (Episodes where j does not act have Z~ = 0: genuine zero samples.)
 So Delta_i >= gain_i - shift_i - bias_i - fs_i; the stage bound is the sum
 over i. A rejected step is the identity (Delta_i = 0): all its terms are 0.

Not covered by the proof, and said plainly: delta_hat_i >= sup_s KL is
assumed (exact for one-state agents such as matrix-game players; the toy tests
check it on the sequential game); Hoeffding treats the accepted params as
fixed although they were fitted on the same batch (as the paper's Theorem
4.9 does); bias_i is a sample estimate, not a confidence bound.

Discounted variant (the paper's constants, Theorems 4.4 and 4.9): the same
gain and bias, shift_i = 2 gamma / (1 - gamma)^2 * A_max * sqrt(d / 2),
bias_i / (1 - gamma), fs_i = A_max / (1 - gamma) * sqrt(log(2n/delta_conf) /
(2 N_i)). At gamma = 0.99 the shift constant is 19,800: vacuous, reported
as such.
"""

import functools
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp

from sat_jax.core import config as config_lib
from sat_jax.core import tracing


def _kappa() -> float:
  # min over r > 2 of (r log r - r + 1) / (r - 2) sits at r - 1 = 2 log r.
  lo, hi = 2.5, 10.0
  for _ in range(100):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if mid - 1 - 2 * math.log(mid) < 0 else (lo, mid)
  r = 0.5 * (lo + hi)
  return (r - 2) / (r * math.log(r) - r + 1)


KAPPA = _kappa()
_LOG_CAP = math.log(2.0)


@functools.partial(
    jax.jit, static_argnames=("baseline", "epsilon", "epsilon_high")
)
def step_statistics(
    u_E: jax.Array,
    reward_E: jax.Array,
    log_rho_E: jax.Array,
    *,
    baseline: float,
    epsilon: float,
    epsilon_high: float,
) -> dict[str, jax.Array]:
  """gain_i and bias_i of one accepted step (module docstring, steps 2-5).

  u_E: the updated agent's sequence log-ratio (new params vs behaviour);
  log_rho_E: the already-updated agents' (0 in `resample` and baselines).
  """
  tracing.count_trace("step_statistics")
  r_E = jnp.exp(jnp.minimum(u_E, _LOG_CAP))
  adv_E = reward_E - baseline
  clipped_E = jnp.clip(r_E, 1.0 - epsilon, 1.0 + epsilon_high)
  z_E = jnp.minimum(r_E * adv_E, clipped_E * adv_E) - adv_E
  rho_E = jnp.exp(jnp.minimum(log_rho_E, 30.0))
  c_E = jnp.minimum(1.0, rho_E)
  return {
      "gain": jnp.mean(c_E * z_E),
      "bias": jnp.mean((rho_E - c_E) * jnp.abs(z_E)),
      "capped_fraction": jnp.mean((u_E > _LOG_CAP).astype(jnp.float32)),
      "num_episodes": jnp.asarray(u_E.shape[0], jnp.float32),
  }


def _delta_hat(step, cfg) -> float:
  """Quantile KL + DKW slack over the agent's own episodes (step 3)."""
  slack = math.sqrt(
      math.log(2 / cfg.dkw_eta) / (2 * max(step["num_own_episodes"], 1))
  )
  return step["kl_quantile"] + slack


def _episodic(step, cfg, num_agents, eps_max):
  a_max = 0.5 * (cfg.reward_bounds[1] - cfg.reward_bounds[0])
  # H bounds the states the agent acts at in one episode (an LM agent's
  # states are its tokens); a batch showing more refutes the configured H,
  # so the larger count is used (never a smaller shift than the data allow).
  h = max(cfg.horizon, step["max_episode_states"])
  d = _delta_hat(step, cfg)
  log_term = math.log(2 * num_agents / cfg.delta_conf)
  return {
      "gain": step["gain"],
      "shift": a_max * min(KAPPA * h * d, math.sqrt(h * d / 2), 1.0),
      "bias": step["bias"],
      "finite_sample": (
          (1 + eps_max)
          * a_max
          * math.sqrt(log_term / (2 * step["num_episodes"]))
      ),
  }


def _discounted(step, cfg, num_agents, eps_max):
  del eps_max
  a_max = 0.5 * (cfg.reward_bounds[1] - cfg.reward_bounds[0])
  g = cfg.gamma
  log_term = math.log(2 * num_agents / cfg.delta_conf)
  return {
      "gain": step["gain"],
      "shift": (
          2 * g / (1 - g) ** 2 * a_max * math.sqrt(_delta_hat(step, cfg) / 2)
      ),
      "bias": step["bias"] / (1 - g),
      "finite_sample": (
          a_max / (1 - g) * math.sqrt(log_term / (2 * step["num_episodes"]))
      ),
  }


VARIANTS: dict[str, Callable[..., dict[str, float]]] = {
    "episodic": _episodic,
    "discounted": _discounted,
}
assert tuple(VARIANTS) == config_lib.CERTIFICATE_VARIANTS
TERMS = ("gain", "shift", "bias", "finite_sample")


def stage_bound(
    steps: Sequence[Mapping[str, Any]],
    cfg: config_lib.CertificateConfig,
    num_agents: int,
    eps_max: float,
    variant: str | None = None,
) -> dict[str, Any]:
  """The stage certificate from host-side step records.

  Each step needs: accepted, gain, bias, kl_quantile, num_own_episodes,
  max_episode_states (the most states the agent acted at in one episode),
  num_episodes. Returns the four summed terms, the lower bound, and the
  per-step terms (lists in update order). `variant` overrides cfg.variant.
  """
  variant = cfg.variant if variant is None else variant
  config_lib.check_choice("certificate variant", variant, tuple(VARIANTS))
  per_step = []
  for step in steps:
    if step["accepted"]:
      terms = VARIANTS[variant](step, cfg, num_agents, eps_max)
    else:
      terms = dict.fromkeys(TERMS, 0.0)
    terms = {k: float(v) for k, v in terms.items()}
    terms["lower_bound"] = (
        terms["gain"] - terms["shift"] - terms["bias"] - terms["finite_sample"]
    )
    per_step.append(terms)
  out: dict[str, Any] = {"variant": variant}
  for name in TERMS + ("lower_bound",):
    out[name] = sum(t[name] for t in per_step)
    out[f"step_{name}"] = [t[name] for t in per_step]
  return out
