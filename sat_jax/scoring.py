"""Chunked per-token log-probs, entropies and exact per-state KL of LMs.

Nothing here builds a [B, T, V] float32 array: the unembedding is applied to
one chunk of `chunk_size` positions at a time inside a `lax.scan`. Each
kernel has a custom VJP that saves only its inputs and [B, T] statistics; its
backward pass is a second scan that recomputes one chunk of logits at a time,
writes their cotangent in closed form (fewer live [B, C, V] buffers than
autodiff through `jax.checkpoint`) and accumulates dw in float32. Logits are
float32 even when hidden states and weights are bfloat16; softmaxes are
normalised as (z - max z) - log sum exp(z - max z), which keeps peaked
distributions as accurate as a plain float32 log_softmax. `temperature` is
a Python float (static under jit).

Two levels:
- Generic kernels on hidden states h_BxTxD and an unembedding w_DxV. Their
  position t is *aligned*: row t of h produces the distribution that is scored
  against `targets[:, t]`.
- Model-level wrappers on token sequences, indexed by the **action position**
  (the SAT trainer relies on this): `logp_BxT[:, t] = log p(tokens[:, t] |
  tokens[:, :t])` and `kl_BxT[:, t] = KL(p_new(.|tokens[:, :t]) ||
  p_old(.|tokens[:, :t]))`. A position has a state when it and the position
  before it are valid (mask 1); other positions (position 0, padding, the first
  token after left padding) give 0.

The model-level wrappers take optional `positions_BxA`: the distinct action
positions whose values are wanted (an agent's own tokens), A <= T per row,
0 for an unused slot (position 0 never has a state). The body still runs
over all T tokens, but the unembedding and the softmax over V, the larger
part of a small model's scoring, run on those A states only; every other
position of the [B, T] result is 0. `action_positions` builds them from a
mask.

The chunk helpers (`chunk_logits`, `to_chunks`, `map_chunks`,
`from_chunks`, `backprop_logits`, `at_positions`, `to_positions`) are
public so that other chunked kernels (`sat_jax.stage0.distill`) follow the
same scheme.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import models
from sat_jax import sharding

PyTree = Any

DEFAULT_CHUNK_SIZE = 128
# Logits are divided by the temperature in float32: below this a logit of any
# size could overflow to inf and the softmax turn NaN (1e-6 is safe up to
# |logit| ~ 3e32; use temperature 0 for greedy sampling instead).
MIN_TEMPERATURE = 1e-6


def check_temperature(
    temperature: float, what: str = "temperature", allow_zero: bool = False
) -> None:
  """Raises ValueError unless `temperature` is finite and >= MIN_TEMPERATURE.

  `allow_zero`: 0 (greedy sampling) is accepted as well.
  """
  if allow_zero and temperature == 0:
    return
  if not MIN_TEMPERATURE <= temperature < float("inf"):
    zero = "0 or " if allow_zero else ""
    raise ValueError(
        f"{what}={temperature} must be {zero}finite and >= {MIN_TEMPERATURE}"
        " (logits are divided by it in float32)"
    )


def check_hidden(h_BxTxD: jax.Array, w_DxV: jax.Array, name: str) -> None:
  if h_BxTxD.ndim != 3 or w_DxV.ndim != 2:
    raise ValueError(
        f"{name}: expected h [B, T, D] and w [D, V], got {h_BxTxD.shape} and"
        f" {w_DxV.shape}"
    )
  if h_BxTxD.shape[-1] != w_DxV.shape[0]:
    raise ValueError(
        f"{name}: hidden size {h_BxTxD.shape[-1]} of h does not match"
        f" w {w_DxV.shape}"
    )


def chunk_logits(
    h_BxCxD: jax.Array, w_DxV: jax.Array, temperature: float
) -> jax.Array:
  """float32 logits / temperature of one chunk."""
  logits_BxCxV = jnp.einsum(
      "bcd,dv->bcv", h_BxCxD, w_DxV, preferred_element_type=jnp.float32
  )
  logits_BxCxV = sharding.shard(logits_BxCxV, ("batch", "length", "act_vocab"))
  return logits_BxCxV / temperature


def to_chunks(x_BxT: jax.Array, c: int) -> jax.Array:
  """[B, T, ...] -> [n, B, C, ...], T zero-padded up to n * C."""
  b, t = x_BxT.shape[:2]
  n = -(-t // c)
  pad = [(0, 0), (0, n * c - t)] + [(0, 0)] * (x_BxT.ndim - 2)
  x = jnp.pad(x_BxT, pad).reshape((b, n, c) + x_BxT.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def from_chunks(x_NxBxC: jax.Array, t: int) -> jax.Array:
  """Inverse of `to_chunks`: [n, B, C, ...] -> [B, T, ...]."""
  n, b, c = x_NxBxC.shape[:3]
  x = jnp.moveaxis(x_NxBxC, 0, 1).reshape((b, n * c) + x_NxBxC.shape[3:])
  return x[:, :t]


def chunk_len(chunk_size: int, t: int) -> int:
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
  return min(chunk_size, t)


def map_chunks(fn, xs):
  """ys = [fn(*x) for x in zip(*xs)] as a `lax.scan` (one chunk live)."""
  return jax.lax.scan(lambda _, x: (None, fn(*x)), None, xs)[1]


def backprop_logits(dz_BxCxV, h_BxCxD, w_DxV, temperature):
  """(dh in h's dtype, dw in float32) from the cotangent of z = h w / tau."""
  dz_BxCxV = (dz_BxCxV / temperature).astype(w_DxV.dtype)
  dh_BxCxD = jnp.einsum(
      "bcv,dv->bcd", dz_BxCxV, w_DxV, preferred_element_type=jnp.float32
  )
  dw_DxV = jnp.einsum(
      "bcd,bcv->dv", h_BxCxD, dz_BxCxV, preferred_element_type=jnp.float32
  )
  return dh_BxCxD.astype(h_BxCxD.dtype), dw_DxV


def _normaliser(z_BxCxV: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(m, s) with log softmax(z) = (z - m) - s: m = max z, s = log sum e^(z-m).

  Kept as two numbers rather than lse = m + s: z - m is exact near the top
  logit, where z - lse would round at the magnitude of the logits.
  """
  m_BxC = jnp.max(z_BxCxV, axis=-1)
  s_BxC = jnp.log(jnp.sum(jnp.exp(z_BxCxV - m_BxC[..., None]), axis=-1))
  return m_BxC, s_BxC


def _log_softmax(z_BxCxV, norm) -> jax.Array:
  m_BxC, s_BxC = norm
  return (z_BxCxV - m_BxC[..., None]) - s_BxC[..., None]


# Log-probs (and entropies). The custom VJP keeps only h, w, the targets and
# [B, T] statistics; its backward pass is a second scan that recomputes each
# chunk's logits, writes d/dz in closed form and accumulates dw in float32
# (a bf16 accumulator would lose precision over many chunks).


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _logprobs(h_BxTxD, w_DxV, targets_BxT, temperature, chunk_size, entropy):
  fwd = _logprobs_fwd(
      h_BxTxD, w_DxV, targets_BxT, temperature, chunk_size, entropy
  )
  return fwd[0]


def _logprobs_fwd(
    h_BxTxD, w_DxV, targets_BxT, temperature, chunk_size, entropy
):
  t = h_BxTxD.shape[1]
  c = chunk_len(chunk_size, t)

  def chunk(h_BxCxD, targets_BxC):
    z_BxCxV = chunk_logits(h_BxCxD, w_DxV, temperature)
    m_BxC, s_BxC = _normaliser(z_BxCxV)
    z_y_BxC = jnp.take_along_axis(z_BxCxV, targets_BxC[..., None], -1)[..., 0]
    logp_BxC = (z_y_BxC - m_BxC) - s_BxC
    if not entropy:
      return (logp_BxC,), (m_BxC, s_BxC)
    # H = -sum_v p_v log p_v.
    logq_BxCxV = _log_softmax(z_BxCxV, (m_BxC, s_BxC))
    entropy_BxC = -jnp.sum(jnp.exp(logq_BxCxV) * logq_BxCxV, axis=-1)
    return (logp_BxC, entropy_BxC), (m_BxC, s_BxC, entropy_BxC)

  outs, stats = map_chunks(
      chunk, (to_chunks(h_BxTxD, c), to_chunks(targets_BxT, c))
  )
  outs = tuple(from_chunks(y, t) for y in outs)
  return outs, (h_BxTxD, w_DxV, targets_BxT, stats)


def _logprobs_bwd(temperature, chunk_size, entropy, res, g):
  # d logp / dz_v = [v = y] - p_v;  d H / dz_v = -p_v (log p_v + H). The
  # log-prob form (not z - E_p[z]) keeps a peaked p free of cancellation
  # between large logits.
  h_BxTxD, w_DxV, targets_BxT, stats = res
  t = h_BxTxD.shape[1]
  c = chunk_len(chunk_size, t)
  vocab_1x1xV = jnp.arange(w_DxV.shape[1], dtype=targets_BxT.dtype)[None, None]

  def chunk(dw_DxV, xs):
    h_BxCxD, targets_BxC, g_chunks, stat_chunks = xs
    z_BxCxV = chunk_logits(h_BxCxD, w_DxV, temperature)
    logq_BxCxV = _log_softmax(z_BxCxV, stat_chunks[:2])
    p_BxCxV = jnp.exp(logq_BxCxV)
    onehot_BxCxV = vocab_1x1xV == targets_BxC[..., None]
    dz_BxCxV = g_chunks[0][..., None] * (onehot_BxCxV - p_BxCxV)
    if entropy:
      h_Bx1xC = stat_chunks[2][..., None]
      dz_BxCxV -= g_chunks[1][..., None] * p_BxCxV * (logq_BxCxV + h_Bx1xC)
    dh_BxCxD, dw_chunk = backprop_logits(dz_BxCxV, h_BxCxD, w_DxV, temperature)
    return dw_DxV + dw_chunk, dh_BxCxD

  xs = (
      to_chunks(h_BxTxD, c),
      to_chunks(targets_BxT, c),
      tuple(to_chunks(gi, c) for gi in g),
      stats,
  )
  dw_DxV, dh_chunks = jax.lax.scan(
      chunk, jnp.zeros(w_DxV.shape, jnp.float32), xs
  )
  return from_chunks(dh_chunks, t), dw_DxV.astype(w_DxV.dtype), None


_logprobs.defvjp(_logprobs_fwd, _logprobs_bwd)


def _check_targets(h_BxTxD, w_DxV, targets_BxT, name):
  check_hidden(h_BxTxD, w_DxV, name)
  if targets_BxT.shape != h_BxTxD.shape[:2]:
    raise ValueError(
        f"{name}: targets {targets_BxT.shape} do not match h"
        f" {h_BxTxD.shape[:2]}"
    )


def token_logprobs_from_hidden(
    h_BxTxD: jax.Array,
    w_DxV: jax.Array,
    targets_BxT: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> jax.Array:
  """Aligned log-probs: logp[b, t] = log_softmax(h[b, t] @ w / tau)[y[b, t]].

  With z = h @ w / tau: logp = z_y - logsumexp_v(z_v). float32 [B, T].
  Differentiable in h and w; one [B, chunk_size, V] f32 chunk at a time.
  """
  _check_targets(h_BxTxD, w_DxV, targets_BxT, "token_logprobs_from_hidden")
  check_temperature(temperature)
  (logp_BxT,) = _logprobs(
      h_BxTxD, w_DxV, targets_BxT, temperature, chunk_size, False
  )
  return logp_BxT


def token_logprobs_and_entropy_from_hidden(
    h_BxTxD: jax.Array,
    w_DxV: jax.Array,
    targets_BxT: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[jax.Array, jax.Array]:
  """Aligned log-probs (as above) and entropies H = -sum_v p_v log p_v.

  p = softmax(h @ w / tau); both outputs float32 [B, T], one logits pass.
  """
  _check_targets(
      h_BxTxD, w_DxV, targets_BxT, "token_logprobs_and_entropy_from_hidden"
  )
  check_temperature(temperature)
  return _logprobs(h_BxTxD, w_DxV, targets_BxT, temperature, chunk_size, True)


# The exact KL, with the same custom-VJP scheme as the log-probs.


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _kl(
    h_new_BxTxD, w_new_DxV, h_old_BxTxD, w_old_DxV, temperature, chunk_size
):
  fwd = _kl_fwd(
      h_new_BxTxD, w_new_DxV, h_old_BxTxD, w_old_DxV, temperature, chunk_size
  )
  return fwd[0]


def _kl_fwd(
    h_new_BxTxD, w_new_DxV, h_old_BxTxD, w_old_DxV, temperature, chunk_size
):
  t = h_new_BxTxD.shape[1]
  c = chunk_len(chunk_size, t)

  def chunk(h_new_BxCxD, h_old_BxCxD):
    # KL = sum_v p_v (log p_v - log q_v): one fused reduction over the two
    # logits chunks (z new, y old), so no log_softmax or probability array
    # is kept besides them. (Not sum_v p_v (z_v - y_v) + lse(y) - lse(z),
    # which cancels large terms when p is peaked.)
    z_BxCxV = chunk_logits(h_new_BxCxD, w_new_DxV, temperature)
    y_BxCxV = chunk_logits(h_old_BxCxD, w_old_DxV, temperature)
    norm_z, norm_y = _normaliser(z_BxCxV), _normaliser(y_BxCxV)
    logp_BxCxV = _log_softmax(z_BxCxV, norm_z)
    d_BxCxV = logp_BxCxV - _log_softmax(y_BxCxV, norm_y)
    kl_BxC = jnp.sum(jnp.exp(logp_BxCxV) * d_BxCxV, axis=-1)
    return kl_BxC, (kl_BxC,) + norm_z + norm_y

  kl_chunks, stats = map_chunks(
      chunk, (to_chunks(h_new_BxTxD, c), to_chunks(h_old_BxTxD, c))
  )
  res = (h_new_BxTxD, w_new_DxV, h_old_BxTxD, w_old_DxV, stats)
  return from_chunks(kl_chunks, t), res


def _kl_bwd(temperature, chunk_size, res, g_BxT):
  # d KL / dz_v = p_v (log p_v - log q_v - KL);  d KL / dy_v = q_v - p_v.
  # Under jax.grad w.r.t. the new side only, the old side's terms are dead
  # code and are dropped (JAX's scan DCE and XLA).
  h_new, w_new, h_old, w_old, stats = res
  t = h_new.shape[1]
  c = chunk_len(chunk_size, t)

  def chunk(dws, xs):
    h_new_BxCxD, h_old_BxCxD, g_BxC, (kl_BxC, *norms) = xs
    z_BxCxV = chunk_logits(h_new_BxCxD, w_new, temperature)
    y_BxCxV = chunk_logits(h_old_BxCxD, w_old, temperature)
    logp_BxCxV = _log_softmax(z_BxCxV, norms[:2])
    logq_BxCxV = _log_softmax(y_BxCxV, norms[2:])
    p_BxCxV = jnp.exp(logp_BxCxV)
    d_BxCxV = logp_BxCxV - logq_BxCxV
    g_BxCx1 = g_BxC[..., None]
    dz = g_BxCx1 * p_BxCxV * (d_BxCxV - kl_BxC[..., None])
    dy = g_BxCx1 * (jnp.exp(logq_BxCxV) - p_BxCxV)
    dh_new, dw_new = backprop_logits(dz, h_new_BxCxD, w_new, temperature)
    dh_old, dw_old = backprop_logits(dy, h_old_BxCxD, w_old, temperature)
    return (dws[0] + dw_new, dws[1] + dw_old), (dh_new, dh_old)

  zeros = (
      jnp.zeros(w_new.shape, jnp.float32),
      jnp.zeros(w_old.shape, jnp.float32),
  )
  xs = (to_chunks(h_new, c), to_chunks(h_old, c), to_chunks(g_BxT, c), stats)
  (dw_new, dw_old), (dh_new, dh_old) = jax.lax.scan(chunk, zeros, xs)
  return (
      from_chunks(dh_new, t),
      dw_new.astype(w_new.dtype),
      from_chunks(dh_old, t),
      dw_old.astype(w_old.dtype),
  )


_kl.defvjp(_kl_fwd, _kl_bwd)


def kl_from_hidden(
    h_new_BxTxD: jax.Array,
    w_new_DxV: jax.Array,
    h_old_BxTxD: jax.Array,
    w_old_DxV: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> jax.Array:
  """Aligned exact KL over the full vocabulary, float32 [B, T].

  KL[b, t] = sum_v p_new(v) (log p_new(v) - log p_old(v)), with p_new =
  softmax(z), z = h_new[b, t] @ w_new / tau, and p_old = softmax(y), y =
  h_old[b, t] @ w_old / tau; clamped at 0 against rounding. The two sides
  may differ in hidden size D but not in V. Differentiable in all four
  arrays; under `jax.grad` w.r.t. the new side alone nothing is computed for
  the old side's gradient.
  """
  check_hidden(h_new_BxTxD, w_new_DxV, "kl_from_hidden (new)")
  check_hidden(h_old_BxTxD, w_old_DxV, "kl_from_hidden (old)")
  if h_new_BxTxD.shape[:2] != h_old_BxTxD.shape[:2]:
    raise ValueError(
        f"kl_from_hidden: h_new {h_new_BxTxD.shape} and h_old"
        f" {h_old_BxTxD.shape} differ in [B, T]"
    )
  if w_new_DxV.shape[1] != w_old_DxV.shape[1]:
    raise ValueError(
        f"kl_from_hidden: vocab sizes differ: new {w_new_DxV.shape[1]}, old"
        f" {w_old_DxV.shape[1]}"
    )
  check_temperature(temperature)
  kl_BxT = _kl(
      h_new_BxTxD, w_new_DxV, h_old_BxTxD, w_old_DxV, temperature, chunk_size
  )
  # Rounding leaves |KL| ~ 1e-7 of either sign when p_new == p_old (XLA may
  # round the two sides' logits differently); KL >= 0 holds exactly.
  return jnp.maximum(kl_BxT, 0.0)


# ------------------------------------------------------------- model level


def _state_mask(mask_BxT: jax.Array) -> jax.Array:
  """1 where position t and t - 1 are both valid: t has a scored state."""
  valid_BxT = mask_BxT > 0
  prev_BxT = jnp.pad(valid_BxT[:, :-1], ((0, 0), (1, 0)))
  return (valid_BxT & prev_BxT).astype(jnp.float32)


def _to_action_positions(aligned_BxT: jax.Array, mask_BxT: jax.Array):
  """Row t - 1 of an aligned result belongs to action position t."""
  shifted_BxT = jnp.pad(aligned_BxT[:, :-1], ((0, 0), (1, 0)))
  return shifted_BxT * _state_mask(mask_BxT)


def _next_tokens(tokens_BxT: jax.Array) -> jax.Array:
  return jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))


def action_positions(
    selected_BxT: np.ndarray, capacity: int | None = None, multiple: int = 16
) -> np.ndarray | None:
  """positions_BxA of the selected positions of each row, in order (host).

  A is `capacity` when every row fits in it (a static bound, e.g. the most
  tokens an agent can say in an episode: one compiled shape for every
  batch), else the largest per-row count rounded up to a multiple of
  `multiple` (batches of similar counts share a shape); at most T. Unused
  slots hold 0. None when A would be T (the full pass is as cheap).
  Position 0 has no state: selecting it raises.
  """
  selected = np.asarray(selected_BxT, bool)
  if selected.ndim != 2:
    raise ValueError(f"action_positions: mask {selected.shape} is not [B, T]")
  if selected[:, :1].any():
    raise ValueError("action_positions: position 0 has no state to score")
  t = selected.shape[1]
  count = int(selected.sum(axis=1).max()) if selected.size else 0
  if capacity is not None and count <= capacity:
    a = capacity
  else:
    a = max(multiple, -(-count // multiple) * multiple)
  if a >= t:
    return None
  # A stable sort puts each row's selected positions first, in order.
  order_BxT = np.argsort(~selected, axis=1, kind="stable")[:, :a]
  keep_BxA = np.take_along_axis(selected, order_BxT, axis=1)
  return np.where(keep_BxA, order_BxT, 0).astype(np.int32)


def _check_positions(positions_BxA, tokens_BxT, name):
  if positions_BxA is None:
    return
  b, t = tokens_BxT.shape
  if positions_BxA.ndim != 2 or positions_BxA.shape[0] != b:
    raise ValueError(
        f"{name}: positions {positions_BxA.shape} are not [B={b}, A]"
    )
  if positions_BxA.shape[1] > t:
    raise ValueError(
        f"{name}: {positions_BxA.shape[1]} positions per row exceed T={t}"
    )
  if not jnp.issubdtype(positions_BxA.dtype, jnp.integer):
    raise ValueError(f"{name}: positions have dtype {positions_BxA.dtype}")


def at_positions(h_BxTxD, tokens_BxT, positions_BxA):
  """(h at each position's state, the token there): the head's inputs.

  Without positions: every state, aligned (row t scores token t + 1).
  """
  if positions_BxA is None:
    return h_BxTxD, _next_tokens(tokens_BxT)
  state_BxA = jnp.maximum(positions_BxA - 1, 0)
  h_BxAxD = jnp.take_along_axis(h_BxTxD, state_BxA[..., None], axis=1)
  return h_BxAxD, jnp.take_along_axis(tokens_BxT, positions_BxA, axis=1)


def to_positions(values_BxA, mask_BxT, positions_BxA):
  """The head's [B, A] (or aligned [B, T]) values as action-position [B, T]."""
  if positions_BxA is None:
    return _to_action_positions(values_BxA, mask_BxT)
  # Unused slots (position 0) land where the state mask is always 0.
  rows_Bx1 = jnp.arange(mask_BxT.shape[0])[:, None]
  out_BxT = jnp.zeros(mask_BxT.shape, values_BxA.dtype)
  out_BxT = out_BxT.at[rows_Bx1, positions_BxA].add(values_BxA)
  return out_BxT * _state_mask(mask_BxT)


def checked_tokens(tokens_BxT, mask_BxT, name):
  """Checks the shapes; returns the tokens with padding ids set to 0.

  Padding ids are arbitrary; one outside the vocabulary, scored as a
  target, would make its (masked) value NaN, and 0 * NaN stays NaN.
  """
  if tokens_BxT.ndim != 2 or mask_BxT.shape != tokens_BxT.shape:
    raise ValueError(
        f"{name}: tokens {tokens_BxT.shape} and mask {mask_BxT.shape} must"
        " both be [B, T]"
    )
  return jnp.where(mask_BxT > 0, tokens_BxT, 0)


def token_logprobs(
    config: models.ModelConfig,
    params: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    remat: bool = False,
    positions_BxA: jax.Array | None = None,
) -> jax.Array:
  """logp_BxT[:, t] = log softmax(z(tokens[:, :t]) / tau)[tokens[:, t]].

  Indexed by action position; 0 where t has no state (see module docstring).
  float32, differentiable in `params`; `remat` recomputes each layer of the
  model body in the backward pass (passed to `models.hidden_states`).
  `positions_BxA`: only those positions (module docstring).
  """
  tokens_BxT = checked_tokens(tokens_BxT, mask_BxT, "token_logprobs")
  _check_positions(positions_BxA, tokens_BxT, "token_logprobs")
  h_BxTxD = models.hidden_states(
      config, params, tokens_BxT, mask_BxT, remat=remat
  )
  w_DxV = models.unembed_matrix(config, params)
  h_head, targets = at_positions(h_BxTxD, tokens_BxT, positions_BxA)
  values = token_logprobs_from_hidden(
      h_head, w_DxV, targets, temperature, chunk_size
  )
  return to_positions(values, mask_BxT, positions_BxA)


def token_logprobs_and_entropy(
    config: models.ModelConfig,
    params: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    remat: bool = False,
    positions_BxA: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """`token_logprobs` and the entropy of the distribution at each state."""
  tokens_BxT = checked_tokens(
      tokens_BxT, mask_BxT, "token_logprobs_and_entropy"
  )
  _check_positions(positions_BxA, tokens_BxT, "token_logprobs_and_entropy")
  h_BxTxD = models.hidden_states(
      config, params, tokens_BxT, mask_BxT, remat=remat
  )
  w_DxV = models.unembed_matrix(config, params)
  h_head, targets = at_positions(h_BxTxD, tokens_BxT, positions_BxA)
  logp, entropy = token_logprobs_and_entropy_from_hidden(
      h_head, w_DxV, targets, temperature, chunk_size
  )
  return (
      to_positions(logp, mask_BxT, positions_BxA),
      to_positions(entropy, mask_BxT, positions_BxA),
  )


def state_kl(
    config_new: models.ModelConfig,
    params_new: PyTree,
    config_old: models.ModelConfig,
    params_old: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    remat: bool = False,
    positions_BxA: jax.Array | None = None,
) -> jax.Array:
  """kl_BxT[:, t] = KL(p_new(.|tokens[:, :t]) || p_old(.|tokens[:, :t])).

  The exact full-vocabulary KL of the two models' distributions (both at
  temperature tau) that produced token t; 0 where t has no state. The two
  configs may differ in everything but `vocab_size`. float32, differentiable
  in `params_new` (no gradient is computed for the old side under
  `jax.grad` w.r.t. `params_new`). `positions_BxA`: only those positions
  (module docstring).
  """
  if config_new.vocab_size != config_old.vocab_size:
    raise ValueError(
        "state_kl: the two models must share a vocabulary, got vocab_size"
        f" {config_new.vocab_size} (new) and {config_old.vocab_size} (old)"
    )
  tokens_BxT = checked_tokens(tokens_BxT, mask_BxT, "state_kl")
  _check_positions(positions_BxA, tokens_BxT, "state_kl")
  # Only the new side is rematted: the old one has no backward pass.
  h_new_BxTxD = models.hidden_states(
      config_new, params_new, tokens_BxT, mask_BxT, remat=remat
  )
  kl = kl_from_hidden(
      at_positions(h_new_BxTxD, tokens_BxT, positions_BxA)[0],
      models.unembed_matrix(config_new, params_new),
      kl_reference_hidden(
          config_old,
          params_old,
          tokens_BxT,
          mask_BxT,
          positions_BxA=positions_BxA,
      ),
      models.unembed_matrix(config_old, params_old),
      temperature,
      chunk_size,
  )
  return to_positions(kl, mask_BxT, positions_BxA)


def kl_reference_hidden(
    config: models.ModelConfig,
    params_old: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    *,
    positions_BxA: jax.Array | None = None,
) -> jax.Array:
  """The old model's side of the KL: its final hidden states at the states
  scored ([B, A, D] at `positions_BxA`, else [B, T, D] aligned). Depends
  only on params_old and the tokens, so an update that measures the KL
  against fixed params_old many times computes it once.
  """
  tokens_BxT = checked_tokens(tokens_BxT, mask_BxT, "kl_reference_hidden")
  _check_positions(positions_BxA, tokens_BxT, "kl_reference_hidden")
  h_BxTxD = models.hidden_states(config, params_old, tokens_BxT, mask_BxT)
  return at_positions(h_BxTxD, tokens_BxT, positions_BxA)[0]


def token_logprobs_and_state_kl(
    config: models.ModelConfig,
    params_new: PyTree,
    params_old: PyTree,
    tokens_BxT: jax.Array,
    mask_BxT: jax.Array,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    *,
    remat: bool = False,
    positions_BxA: jax.Array | None = None,
    reference_hidden: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """`token_logprobs` of params_new and `state_kl` of new against old.

  One body pass on params_new serves both (and one backward through it),
  where the two functions would run it twice; the values are the same.
  Both models share `config` (the trainer's case: one agent's new and
  stage-start params). `reference_hidden`: `kl_reference_hidden` of
  params_old on the same tokens and positions, computed once for many
  calls (the old model's body pass is then skipped; params_old only gives
  its output matrix).
  """
  tokens_BxT = checked_tokens(
      tokens_BxT, mask_BxT, "token_logprobs_and_state_kl"
  )
  _check_positions(positions_BxA, tokens_BxT, "token_logprobs_and_state_kl")
  h_new_BxTxD = models.hidden_states(
      config, params_new, tokens_BxT, mask_BxT, remat=remat
  )
  w_new_DxV = models.unembed_matrix(config, params_new)
  h_new, targets = at_positions(h_new_BxTxD, tokens_BxT, positions_BxA)
  if reference_hidden is None:
    h_old = kl_reference_hidden(
        config, params_old, tokens_BxT, mask_BxT, positions_BxA=positions_BxA
    )
  elif reference_hidden.shape != h_new.shape:
    raise ValueError(
        "token_logprobs_and_state_kl: reference_hidden"
        f" {reference_hidden.shape} != {h_new.shape}, the new side's states"
        " (same tokens and positions?)"
    )
  else:
    h_old = reference_hidden
  logp = token_logprobs_from_hidden(
      h_new, w_new_DxV, targets, temperature, chunk_size
  )
  kl = kl_from_hidden(
      h_new,
      w_new_DxV,
      h_old,
      models.unembed_matrix(config, params_old),
      temperature,
      chunk_size,
  )
  return (
      to_positions(logp, mask_BxT, positions_BxA),
      to_positions(kl, mask_BxT, positions_BxA),
  )
