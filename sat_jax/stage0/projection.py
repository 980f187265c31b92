"""The per-state KL projection of a stronger model onto an agent (DESIGN §5).

Stage 0 replaces agent j's policy pi_cur by a pretrained pi_pre without
leaving the trust region. Per state s, with a = log pi_pre(.|s) and
b = log pi_cur(.|s) (both at the agent's temperature), the projection is the
geometric mixture

  pi_new  ∝  pi_pre^(1/(1+lambda)) * pi_cur^(lambda/(1+lambda))
          =  exp(beta a + (1 - beta) b - A(beta)),   beta = 1 / (1 + lambda),

with the smallest lambda >= 0 (the largest beta in [0, 1]) such that
KL(pi_new || pi_cur) <= delta_0. With d = a - b,

  KL(beta) = beta E_beta[d] - A(beta),   A(beta) = log E_cur[exp(beta d)],
  dKL/dbeta = beta Var_beta(d) >= 0,

so KL grows with beta from KL(0) = 0, and the largest feasible beta is found
by bisection, vectorised over states: beta = 1 (lambda = 0) where pi_pre is
already inside, else the lower end of the final bracket (always feasible).
`BISECTION_STEPS` halvings leave a bracket below float32 resolution.

Everything here works on [..., V] arrays of one chunk of states; the
chunked model-level passes are in `distill.py` and `product.py`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

BISECTION_STEPS = 30


class Projection(NamedTuple):
  log_probs: jax.Array  # [..., V] float32: log pi_new
  beta: jax.Array  # [...]: 1 / (1 + lambda), in [0, 1]
  kl: jax.Array  # [...]: KL(pi_new || pi_cur) <= delta_0 (up to rounding)

  @property
  def lam(self) -> jax.Array:
    """lambda = 1 / beta - 1 (inf where beta = 0: pi_new = pi_cur)."""
    return 1.0 / self.beta - 1.0


def mixture_log_probs(
    logp_pre_xV: jax.Array, logp_cur_xV: jax.Array, beta_x: jax.Array
) -> jax.Array:
  """log pi_beta = log_softmax(beta a + (1 - beta) b), float32 [..., V]."""
  beta = beta_x[..., None]
  z_xV = beta * logp_pre_xV + (1.0 - beta) * logp_cur_xV
  return jax.nn.log_softmax(z_xV, axis=-1)


def kl(logp_p_xV: jax.Array, logp_q_xV: jax.Array) -> jax.Array:
  """KL(p || q) = sum_v p_v (log p_v - log q_v) over the last axis, >= 0.

  Terms with p_v = 0 are 0 (also where q_v = 0 there).
  """
  p_xV = jnp.exp(logp_p_xV)
  terms = jnp.where(p_xV > 0, p_xV * (logp_p_xV - logp_q_xV), 0.0)
  return jnp.maximum(jnp.sum(terms, axis=-1), 0.0)


def projection_beta(
    logp_pre_xV: jax.Array,
    logp_cur_xV: jax.Array,
    delta0: float | jax.Array,
    steps: int = BISECTION_STEPS,
) -> jax.Array:
  """The largest beta in [0, 1] with KL(pi_beta || pi_cur) <= delta0.

  Inputs are normalised log-probs [..., V] (finite where pi_cur > 0).
  delta0 = 0 gives beta = 0 (pi_cur) unless pi_pre equals pi_cur.
  """

  def kl_at(beta_x):
    return kl(mixture_log_probs(logp_pre_xV, logp_cur_xV, beta_x), logp_cur_xV)

  shape = logp_pre_xV.shape[:-1]
  inside_x = kl_at(jnp.ones(shape, jnp.float32)) <= delta0

  def halve(_, bracket):
    lo_x, hi_x = bracket
    mid_x = 0.5 * (lo_x + hi_x)
    ok_x = kl_at(mid_x) <= delta0
    return jnp.where(ok_x, mid_x, lo_x), jnp.where(ok_x, hi_x, mid_x)

  lo_x, _ = jax.lax.fori_loop(
      0,
      steps,
      halve,
      (jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32)),
  )
  # float32 rounds a KL near 0 to either sign: at delta0 = 0 the bisection
  # would creep up to beta ~ 1e-3, so the zero ball is pi_cur exactly.
  return jnp.where(inside_x, 1.0, jnp.where(delta0 > 0, lo_x, 0.0))


def project_log_probs(
    logp_pre_xV: jax.Array,
    logp_cur_xV: jax.Array,
    delta0: float | jax.Array,
    steps: int = BISECTION_STEPS,
) -> Projection:
  """The projection of pi_pre onto the delta0-ball around pi_cur."""
  logp_pre_xV = logp_pre_xV.astype(jnp.float32)
  logp_cur_xV = logp_cur_xV.astype(jnp.float32)
  beta_x = projection_beta(logp_pre_xV, logp_cur_xV, delta0, steps)
  logp_new_xV = mixture_log_probs(logp_pre_xV, logp_cur_xV, beta_x)
  return Projection(logp_new_xV, beta_x, kl(logp_new_xV, logp_cur_xV))


def project_logits(
    logits_pre_xV: jax.Array,
    logits_cur_xV: jax.Array,
    delta0: float | jax.Array,
    temperature: float = 1.0,
    steps: int = BISECTION_STEPS,
) -> Projection:
  """`project_log_probs` of the two models' logits at `temperature`."""
  logp_pre = jax.nn.log_softmax(
      logits_pre_xV.astype(jnp.float32) / temperature, axis=-1
  )
  logp_cur = jax.nn.log_softmax(
      logits_cur_xV.astype(jnp.float32) / temperature, axis=-1
  )
  return project_log_probs(logp_pre, logp_cur, delta0, steps)
