"""`reuse` vs `resample` by exact enumeration on a two-agent matrix game.

Agent 0 is updated first (pi_0^cur -> pi_0^tar), then agent 1 proposes
pi_1^tar. The expected surrogate improvement of agent 1's proposal, over
whole groups of G episodes (the group statistics make it nonlinear, so the
expectation is a sum over all (joint action)^G outcomes), is

  reuse     S_re = E_{groups ~ pi_cur}[mean_g c_g (s(r_g, A_g) - A_g)]
            with c = min(1, rho), rho = pi_0^tar / pi_0^cur of agent 0's
            action, A the c-weighted group z-score (advantage.py);
  resample  S_rs = E_{groups ~ pi_hat^1}[mean_g (s(r_g, A_g) - A_g)]
            with the plain z-score of a fresh group under pi_hat^1;
  s(r, A) = min(r A, clip(r, 1 - eps, 1 + eps) A), r = pi_1^tar / pi_1^cur.

The truncation bias is T = E_{pi_cur}[mean_g (rho_g - c_g) |s_g - A_g|]:
what c = min(1, rho) drops relative to the untruncated weight. Both use the
library's jitted `sequence_advantages`, vmapped over all groups.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from sat_jax.core import advantage
from sat_jax.toy import games


def _probs(logits) -> np.ndarray:
  return games.softmax(np.asarray(logits, np.float64)[0])


def kl_step(logits, direction, delta: float) -> np.ndarray:
  """logits + t * direction with KL(new || old) = delta (bisection on t).

  KL(softmax(logits + t d) || old) rises monotonically in t >= 0 (its
  derivative is t Var_new(d)) towards -log old(argmax d), old(argmax d)
  being the mass the old policy puts on d's maximal actions. A delta at or
  beyond that limit (or any delta > 0 along a constant direction, whose
  limit is 0) has no step, so it is a ValueError rather than a step that
  silently falls short of delta (or NaN, once the bracket overflows).
  """
  logits = np.asarray(logits, np.float64)
  direction = np.asarray(direction, np.float64)
  if direction.shape != logits.shape or not np.isfinite(direction).all():
    raise ValueError(
        f"direction must be finite with the logits' shape {logits.shape}, "
        f"got {direction.shape}: {direction}"
    )
  if not (np.isfinite(delta) and delta > 0):
    raise ValueError(f"delta must be a finite KL > 0, got {delta}")
  old = games.softmax(logits)
  # log1p of the mass off the maximal actions: exactly 0 for a constant d.
  reachable = float(-np.log1p(-old[direction < direction.max()].sum()))
  if delta >= reachable:
    raise ValueError(
        f"delta={delta} is not reachable along direction {direction}: "
        f"KL(new || old) stays below {reachable:.6g} for every step"
    )

  def kl(t):
    new = games.softmax(logits + t * direction)
    return float(np.sum(new * (np.log(new) - np.log(old))))

  lo, hi = 0.0, 1.0
  while kl(hi) < delta:
    if hi * 2 == np.inf:  # a tiny direction: the bracket would overflow
      raise ValueError(
          f"delta={delta} not reached along direction {direction} by step "
          f"t = {hi:.6g} (KL there {kl(hi):.6g}, limit {reachable:.6g})"
      )
    hi *= 2
  for _ in range(80):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if kl(mid) < delta else (lo, mid)
  return logits + 0.5 * (lo + hi) * direction


def _group_surrogates(
    joint_probs, reward, rho, ratio, group_size, epsilon, a_clip, std_eps, reuse
):
  """E over all groups of mean_g c (s - A), and of mean_g (rho - c)|s - A|."""
  k = reward.shape[0]
  tuples = np.array(list(itertools.product(range(k), repeat=group_size)))
  weight = np.prod(joint_probs[tuples], axis=1)
  log_rho = np.log(rho[tuples]) if reuse else np.zeros(tuples.shape)
  group = jnp.zeros((group_size,), jnp.int32)
  adv_fn = jax.vmap(
      lambda r, lr: advantage.sequence_advantages(
          r, group, lr, num_groups=1, a_clip=a_clip, std_eps=std_eps
      )
  )
  out = adv_fn(
      jnp.asarray(reward[tuples], jnp.float32),
      jnp.asarray(log_rho, jnp.float32),
  )
  adv, c = np.asarray(out.adv_E, np.float64), np.asarray(out.c_E, np.float64)
  r = ratio[tuples]
  s = np.minimum(r * adv, np.clip(r, 1 - epsilon, 1 + epsilon) * adv) - adv
  surrogate = np.sum(weight * np.mean(c * s, axis=1))
  rho_t = rho[tuples] if reuse else np.ones(tuples.shape)
  bias = np.sum(weight * np.mean((rho_t - c) * np.abs(s), axis=1))
  return float(surrogate), float(bias)


def reuse_vs_resample(
    game: games.MatrixGame,
    logits_cur,
    delta: float,
    group_size: int,
    epsilon: float = 0.2,
    a_clip: float = 5.0,
    std_eps: float = 1e-6,
) -> dict:
  """Exact S_re, S_rs and T when both agents move by KL delta along dJ.

  Agent 0 moves along the gradient of J w.r.t. its logits at pi_cur; agent 1
  along the gradient at pi_hat^1 (its best first-order move in the
  intermediate team). Returns the three numbers and the gap S_re - S_rs.
  """
  if game.payoff.ndim != 2:
    raise ValueError("reuse_vs_resample needs a two-agent matrix game")
  p0, p1 = _probs(logits_cur[0]), _probs(logits_cur[1])
  payoff = game.payoff
  grad0 = p0 * (payoff @ p1 - p0 @ payoff @ p1)  # dJ/dlogits of agent 0
  tar0 = kl_step(np.asarray(logits_cur[0])[0], grad0, delta)
  q0 = games.softmax(tar0)
  grad1 = p1 * (q0 @ payoff - q0 @ payoff @ p1)
  tar1 = kl_step(np.asarray(logits_cur[1])[0], grad1, delta)
  q1 = games.softmax(tar1)
  reward = payoff.reshape(-1)
  rho = np.repeat(q0 / p0, p1.shape[0])  # joint index = a0 * m1 + a1
  ratio = np.tile(q1 / p1, p0.shape[0])
  kw = dict(
      group_size=group_size, epsilon=epsilon, a_clip=a_clip, std_eps=std_eps
  )
  s_re, bias = _group_surrogates(
      np.outer(p0, p1).reshape(-1), reward, rho, ratio, reuse=True, **kw
  )
  s_rs, _ = _group_surrogates(
      np.outer(q0, p1).reshape(-1), reward, rho, ratio, reuse=False, **kw
  )
  return {
      "delta": delta,
      "reuse": s_re,
      "resample": s_rs,
      "gap": s_re - s_rs,
      "truncation_bias": bias,
  }
