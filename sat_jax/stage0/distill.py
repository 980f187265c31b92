"""Distilling the Stage-0 projection into a model's weights (DESIGN §5 (b)).

The student pi_theta (initialised from pi_pre) is fitted to the projected
policy pi_new (`projection.py`) on states drawn from the current team's
occupancy (agent j's own positions in a team rollout): the loss is the
masked mean over those states of the exact full-vocabulary

  KL(pi_new(.|s) || pi_theta(.|s)),

and the monitor is the (1 - alpha)-quantile over held-out states of
KL(pi_theta(.|s) || pi_cur(.|s)), the trust region SAT itself enforces.

`projected_kl_from_hidden` is the chunked kernel: like `sat_jax.scoring` it
never builds a [B, T, V] array; its custom VJP saves the per-state beta of the
projection and recomputes pi_new one chunk at a time in the backward pass
(d loss / dz_theta = p_theta - pi_new, in closed form). Only the student
side is differentiated: the teacher (pi_pre) and the reference (pi_cur)
receive zero cotangents.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp

from sat_jax import models
from sat_jax import scoring
from sat_jax.stage0 import projection

PyTree = Any


def _log_softmax_chunk(h_BxCxD, w_DxV, temperature):
  z_BxCxV = scoring.chunk_logits(h_BxCxD, w_DxV, temperature)
  return jax.nn.log_softmax(z_BxCxV, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _projected_kl(h_s, w_s, h_pre, w_pre, h_cur, w_cur, delta0, tau, chunk):
  return _projected_kl_fwd(
      h_s, w_s, h_pre, w_pre, h_cur, w_cur, delta0, tau, chunk
  )[0]


def _projected_kl_fwd(h_s, w_s, h_pre, w_pre, h_cur, w_cur, delta0, tau, chunk):
  t = h_s.shape[1]
  c = scoring.chunk_len(chunk, t)
  to_chunks = scoring.to_chunks

  def one(h_s_BxCxD, h_pre_BxCxD, h_cur_BxCxD):
    proj = projection.project_log_probs(
        _log_softmax_chunk(h_pre_BxCxD, w_pre, tau),
        _log_softmax_chunk(h_cur_BxCxD, w_cur, tau),
        delta0,
    )
    logp_s = _log_softmax_chunk(h_s_BxCxD, w_s, tau)
    return (projection.kl(proj.log_probs, logp_s), proj.beta)

  loss_chunks, beta_chunks = scoring.map_chunks(
      one, (to_chunks(h_s, c), to_chunks(h_pre, c), to_chunks(h_cur, c))
  )
  from_chunks = scoring.from_chunks
  outs = (from_chunks(loss_chunks, t), from_chunks(beta_chunks, t))
  return outs, (h_s, w_s, h_pre, w_pre, h_cur, w_cur, beta_chunks)


def _projected_kl_bwd(delta0, tau, chunk, res, g):
  del delta0  # beta is saved: pi_new is recomputed without the bisection.
  h_s, w_s, h_pre, w_pre, h_cur, w_cur, beta_chunks = res
  g_loss_BxT = g[0]  # beta is a statistic; its cotangent is ignored.
  t = h_s.shape[1]
  c = scoring.chunk_len(chunk, t)
  to_chunks = scoring.to_chunks

  def one(dw_DxV, xs):
    h_s_BxCxD, h_pre_BxCxD, h_cur_BxCxD, beta_BxC, g_BxC = xs
    logp_new = projection.mixture_log_probs(
        _log_softmax_chunk(h_pre_BxCxD, w_pre, tau),
        _log_softmax_chunk(h_cur_BxCxD, w_cur, tau),
        beta_BxC,
    )
    logp_s = _log_softmax_chunk(h_s_BxCxD, w_s, tau)
    # d KL(q || p_s) / dz_s = p_s - q (z_s: the student's scaled logits).
    dz = g_BxC[..., None] * (jnp.exp(logp_s) - jnp.exp(logp_new))
    dh, dw = scoring.backprop_logits(dz, h_s_BxCxD, w_s, tau)
    return dw_DxV + dw, dh

  xs = (
      to_chunks(h_s, c),
      to_chunks(h_pre, c),
      to_chunks(h_cur, c),
      beta_chunks,
      to_chunks(g_loss_BxT, c),
  )
  dw_s, dh_chunks = jax.lax.scan(one, jnp.zeros(w_s.shape, jnp.float32), xs)
  dh_s = scoring.from_chunks(dh_chunks, t)
  zeros = [jnp.zeros_like(x) for x in (h_pre, w_pre, h_cur, w_cur)]
  return (dh_s, dw_s.astype(w_s.dtype), *zeros)


_projected_kl.defvjp(_projected_kl_fwd, _projected_kl_bwd)


def projected_kl_from_hidden(
    h_student_BxTxD: jax.Array,
    w_student_DxV: jax.Array,
    h_pre_BxTxD: jax.Array,
    w_pre_DxV: jax.Array,
    h_cur_BxTxD: jax.Array,
    w_cur_DxV: jax.Array,
    delta0: float,
    temperature: float = 1.0,
    chunk_size: int = scoring.DEFAULT_CHUNK_SIZE,
) -> tuple[jax.Array, jax.Array]:
  """Aligned (KL(pi_new || pi_student), beta), float32 [B, T] each.

  pi_new is the projection of softmax(h_pre w_pre / tau) onto the delta0-ball
  around softmax(h_cur w_cur / tau) at each row; beta its mixing exponent.
  The three sides may differ in hidden size, not in V. Differentiable in
  the student's h and w only.
  """
  sides = {
      "student": (h_student_BxTxD, w_student_DxV),
      "pre": (h_pre_BxTxD, w_pre_DxV),
      "cur": (h_cur_BxTxD, w_cur_DxV),
  }
  for name, (h, w) in sides.items():
    scoring.check_hidden(h, w, f"projected_kl_from_hidden ({name})")
  shapes = {n: (h.shape[:2], w.shape[1]) for n, (h, w) in sides.items()}
  if len(set(shapes.values())) != 1:
    raise ValueError(
        "projected_kl_from_hidden: the sides differ in [B, T] or vocab:"
        f" {shapes}"
    )
  scoring.check_temperature(temperature)
  if not delta0 >= 0:
    raise ValueError(f"delta0={delta0} must be >= 0")
  loss_BxT, beta_BxT = _projected_kl(
      h_student_BxTxD,
      w_student_DxV,
      h_pre_BxTxD,
      w_pre_DxV,
      h_cur_BxTxD,
      w_cur_DxV,
      float(delta0),
      temperature,
      chunk_size,
  )
  return jnp.maximum(loss_BxT, 0.0), beta_BxT


def teacher_hidden(
    config: models.ModelConfig,
    params: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    positions_BxA: jax.Array | None,
) -> jax.Array:
  """A fixed model's final hidden states at the scored states (no grad)."""
  return scoring.kl_reference_hidden(
      config,
      jax.lax.stop_gradient(params),
      tokens_BxT,
      mask_BxT,
      positions_BxA=positions_BxA,
  )


def projected_kl(
    config_student: models.ModelConfig,
    params_student: PyTree,
    w_pre_DxV: jax.Array,
    h_pre: jax.Array,
    w_cur_DxV: jax.Array,
    h_cur: jax.Array,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    delta0: float,
    temperature: float = 1.0,
    chunk_size: int = scoring.DEFAULT_CHUNK_SIZE,
    *,
    positions_BxA: jax.Array | None = None,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """By action position, [B, T] each: KL(pi_new || pi_student), beta, and
  KL(pi_student || pi_cur) (the monitored statistic, differentiable too).

  `h_pre` / `h_cur`: `teacher_hidden` of pi_pre / pi_cur on the same tokens
  and positions (fixed during distillation: computed once per batch).
  Position t scores the state tokens[:t], as in `sat_jax.scoring`; 0 where
  t has no state (or is not among `positions_BxA`). Under jit an unused
  third output costs nothing.
  """
  tokens_BxT = scoring.checked_tokens(tokens_BxT, mask_BxT, "projected_kl")
  h_BxTxD = models.hidden_states(
      config_student, params_student, tokens_BxT, mask_BxT, remat=remat
  )
  h_s = scoring.at_positions(h_BxTxD, tokens_BxT, positions_BxA)[0]
  w_s = models.unembed_matrix(config_student, params_student)
  w_cur_DxV = jax.lax.stop_gradient(w_cur_DxV)
  loss, beta = projected_kl_from_hidden(
      h_s,
      w_s,
      h_pre,
      jax.lax.stop_gradient(w_pre_DxV),
      h_cur,
      w_cur_DxV,
      delta0,
      temperature,
      chunk_size,
  )
  kl_cur = scoring.kl_from_hidden(
      h_s, w_s, h_cur, w_cur_DxV, temperature, chunk_size
  )
  return tuple(
      scoring.to_positions(x, mask_BxT, positions_BxA)
      for x in (loss, beta, kl_cur)
  )
