"""KV-cache sampling: one jitted prefill + `lax.while_loop` decode per bucket.

    tokens_BxP, mask_BxP = sampling.pad_prompts(prompt_ids, options)
    out = sampling.sample(config, params, tokens_BxP, mask_BxP, options, key)
    out.tokens_BxN, out.logprobs_BxN, out.mask_BxN, out.lengths_B

Prompts are left-padded to a bucket length P (`options.prompt_buckets`, at
most max_seq_len - N), so a given (config, options, batch size, bucket)
compiles once. The cache holds P + N slots (N = max_new_tokens); decoding
writes one slot per step with `dynamic_update_slice` and stops early once
every row is done (filler rows, all padding, are done from the start). New
token n is drawn with key `fold_in(key, n)` from the distribution of
`filtered_log_probs`, and its log-prob under exactly that distribution is
returned. After a row's stop token its tokens are `pad_token_id`, its mask 0
and its log-probs 0.
"""

import dataclasses
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import scoring
from sat_jax.models import config as config_lib
from sat_jax.models import transformer

PyTree = Any
DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class SamplingError(ValueError):
  """Bad sampling options or prompts; the message names the value."""


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
  """How to sample. Hashable: changing a field recompiles.

  temperature 0 is greedy decoding (its log-probs are those of the plain
  model distribution, temperature 1 and no filtering, since the degenerate
  greedy distribution would give 0). top_k = 0 and top_p = 1 switch those
  filters off. `cache_dtype` None uses `default_cache_dtype`. Models with at
  most `unroll_layers_up_to` layers run with an unrolled layer loop over
  per-layer fused weights and per-layer cache buffers (faster steps, L
  copies of a layer to compile, one copy of the layer weights per call);
  deeper ones use `lax.scan` over the stacks.
  """

  max_new_tokens: int = 64
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  stop_token_ids: tuple[int, ...] = ()
  pad_token_id: int = 0
  prompt_buckets: tuple[int, ...] = DEFAULT_BUCKETS
  cache_dtype: str | None = None
  unroll_layers_up_to: int = 8

  def __post_init__(self):
    object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
    object.__setattr__(self, "prompt_buckets", tuple(self.prompt_buckets))
    if self.max_new_tokens < 1:
      raise SamplingError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
    try:
      scoring.check_temperature(self.temperature, allow_zero=True)
    except ValueError as e:
      raise SamplingError(str(e)) from None
    if not 0 < self.top_p <= 1:
      raise SamplingError(f"top_p={self.top_p} must be in (0, 1]")
    if self.top_k < 0:
      raise SamplingError(f"top_k={self.top_k} must be >= 0 (0: off)")
    if self.pad_token_id < 0 or any(i < 0 for i in self.stop_token_ids):
      raise SamplingError("pad_token_id and stop_token_ids must be >= 0")
    buckets = self.prompt_buckets
    if (
        not buckets
        or any(b < 1 for b in buckets)
        or list(buckets) != sorted(set(buckets))
    ):
      raise SamplingError(
          f"prompt_buckets={buckets} must be increasing positive ints"
      )

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


@flax.struct.dataclass
class SampleOutput:
  tokens_BxN: jax.Array  # int32, pad_token_id after a row's stop token.
  logprobs_BxN: jax.Array  # float32, 0 where mask is 0.
  mask_BxN: jax.Array  # int32, 1 up to and including the stop token.
  lengths_B: jax.Array  # int32, number of new tokens per row.


def bucket_length(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length."""
  for b in buckets:
    if b >= length:
      return b
  raise SamplingError(
      f"prompt of {length} tokens is longer than the largest bucket"
      f" {buckets[-1]}"
  )


def pad_prompts(
    prompts: Sequence[Sequence[int]],
    options: SamplingOptions,
    *,
    batch_size: int | None = None,
    length: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads id lists into (tokens_BxP, mask_BxP) int32 numpy arrays.

  P is `length` if given, else the bucket of the longest prompt. With
  `batch_size`, rows are added (all padding, mask 0) up to that size, so that
  the batch shape stays fixed across calls; `sample` gives them no new
  tokens (length 0).
  """
  if not prompts:
    raise SamplingError("no prompts")
  longest = max(len(p) for p in prompts)
  for i, p in enumerate(prompts):
    if len(p) == 0:  # pylint: disable=g-explicit-length-test (numpy rows)
      raise SamplingError(f"prompt {i} is empty")
  p_len = (
      bucket_length(longest, options.prompt_buckets)
      if length is None
      else length
  )
  if longest > p_len:
    raise SamplingError(f"prompt of {longest} tokens exceeds length {p_len}")
  b = len(prompts) if batch_size is None else batch_size
  if b < len(prompts):
    raise SamplingError(f"{len(prompts)} prompts exceed batch_size={b}")
  tokens = np.full((b, p_len), options.pad_token_id, np.int32)
  mask = np.zeros((b, p_len), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, p_len - len(p) :] = np.asarray(p, np.int32)
    mask[i, p_len - len(p) :] = 1
  return tokens, mask


def _top_p_threshold(probs_BxV: jax.Array, top_p: float) -> jax.Array:
  """Largest t with sum(p_i for p_i >= t) >= top_p, per row (float32 [B, 1]).

  Bisection over the bit patterns of non-negative float32 (ordered like the
  values), so the threshold is exact after 31 steps and needs no sort of V.
  """
  b = probs_BxV.shape[0]
  lo = jnp.zeros((b,), jnp.int32)  # mass(0) = 1 >= top_p
  hi = jnp.full((b,), 0x3F800001, jnp.int32)  # just above 1.0: mass 0

  def step(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    t = jax.lax.bitcast_convert_type(mid, jnp.float32)[:, None]
    mass = jnp.sum(jnp.where(probs_BxV >= t, probs_BxV, 0.0), axis=-1)
    ok = mass >= top_p
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

  lo, _ = jax.lax.fori_loop(0, 31, step, (lo, hi))
  return jax.lax.bitcast_convert_type(lo, jnp.float32)[:, None]


def filtered_logits(
    logits_BxV: jax.Array, options: SamplingOptions
) -> jax.Array:
  """Logits of the sampling distribution pi, float32 [B, V], -inf = removed.

  pi = softmax(logits / temperature) restricted to the top-k logits (ties
  with the k-th kept), then to the smallest top set whose renormalised mass
  reaches top_p (ties at the threshold kept), renormalised. Greedy
  (temperature 0): the plain logits.
  """
  x = logits_BxV.astype(jnp.float32)
  if options.greedy:
    return x
  x = x / options.temperature
  if 0 < options.top_k < x.shape[-1]:
    kth = jax.lax.top_k(x, options.top_k)[0][:, -1:]
    x = jnp.where(x >= kth, x, -jnp.inf)
  if options.top_p < 1:
    probs = jax.nn.softmax(x, axis=-1)
    x = jnp.where(probs >= _top_p_threshold(probs, options.top_p), x, -jnp.inf)
  return x


def filtered_log_probs(
    logits_BxV: jax.Array, options: SamplingOptions
) -> jax.Array:
  """log pi(v) for every v (see `filtered_logits`), float32 [B, V].

  What a scorer recomputes to match the sampler's log-probs exactly.
  """
  return jax.nn.log_softmax(filtered_logits(logits_BxV, options), axis=-1)


def _last_positive(x_BxN: jax.Array) -> jax.Array:
  """Index of the last positive entry per row (0 if none)."""
  n = x_BxN.shape[-1]
  return n - 1 - jnp.argmax(x_BxN[:, ::-1] > 0, axis=-1)


def _block_size(v: int) -> int:
  """A power-of-two block in [64, 256] dividing V if any (no padding copy)."""
  for block in (256, 128, 64):
    if v % block == 0:
      return block
  return 256


def _draw(probs_BxV: jax.Array, key: jax.Array) -> jax.Array:
  """One index per row with P(v) = probs[v] / sum(probs): inverse CDF.

  Two levels, so that no [B, V] random numbers (Gumbel) and no cumsum over
  V are needed: pick a block of entries by its mass, then an entry inside
  it, with one uniform u per row (`_inverse_cdf`).
  """
  return _inverse_cdf(probs_BxV, jax.random.uniform(key, probs_BxV.shape[:1]))


def _inverse_cdf(probs_BxV: jax.Array, uniform_B: jax.Array) -> jax.Array:
  """The entry of each row whose CDF interval holds u * sum(probs).

  `uniform_B` in [0, 1). A token of zero probability is never returned,
  whatever the rounding.
  """
  b, v = probs_BxV.shape
  block = _block_size(v)
  nb = -(-v // block)
  if nb * block != v:
    probs_BxV = jnp.pad(probs_BxV, ((0, 0), (0, nb * block - v)))
  p_BxCxK = probs_BxV.reshape(b, nb, block)
  mass_BxC = jnp.sum(p_BxCxK, axis=-1)
  cdf_BxC = jnp.cumsum(mass_BxC, axis=-1)
  u_B = uniform_B * cdf_BxC[:, -1]
  blk_B = jnp.minimum(
      jnp.sum(cdf_BxC <= u_B[:, None], axis=-1), _last_positive(mass_BxC)
  )
  before_B = jnp.take_along_axis(cdf_BxC - mass_BxC, blk_B[:, None], 1)[:, 0]
  inner_BxK = jnp.take_along_axis(p_BxCxK, blk_B[:, None, None], 1)[:, 0]
  cdf_BxK = jnp.cumsum(inner_BxK, axis=-1)
  # cdf - mass is rounded anew and can exceed the block's true start (the
  # cdf of the blocks before it), so u - before can be below 0, where the
  # count below would be 0 and pick entry 0 whatever its probability. At
  # r >= 0 the first entry with cdf > r has a positive probability.
  r_B = jnp.maximum(u_B - before_B, 0.0)
  j_B = jnp.minimum(
      jnp.sum(cdf_BxK <= r_B[:, None], axis=-1),
      _last_positive(inner_BxK),
  )
  return blk_B * block + j_B


def sample_from_logits(
    logits_BxV: jax.Array, key: jax.Array, options: SamplingOptions
) -> tuple[jax.Array, jax.Array]:
  """(token_B, logprob_B): one draw per row and its log-prob log pi(token).

  Works on unnormalised e = exp(x - max x), so that the [B, V] log-softmax
  is never materialised: log pi(v) = x_v - max x - log sum(e).
  """
  x = filtered_logits(logits_BxV, options)
  m_B = jnp.max(x, axis=-1)
  e_BxV = jnp.exp(x - m_B[:, None])
  if options.greedy:
    token = jnp.argmax(x, axis=-1).astype(jnp.int32)
  else:
    token = _draw(e_BxV, key).astype(jnp.int32)
  x_tok = jnp.take_along_axis(x, token[:, None], axis=-1)[:, 0]
  return token, x_tok - m_B - jnp.log(jnp.sum(e_BxV, axis=-1))


_TRACES = [0]


def num_traces() -> int:
  """How many times the decode function has been traced (compiles)."""
  return _TRACES[0]


def _is_stop(token_B: jax.Array, options: SamplingOptions) -> jax.Array:
  if not options.stop_token_ids:
    return jnp.zeros(token_B.shape, bool)
  stops = jnp.asarray(options.stop_token_ids, jnp.int32)
  return jnp.any(token_B[:, None] == stops[None, :], axis=-1)


def default_cache_dtype(param_dtype: Any, backend: str | None = None):
  """The KV cache's dtype when the options leave it open.

  The params' dtype, except on CPU, where 16-bit float params get a float32
  cache: XLA's CPU backend computes 16-bit float ops in float32, which
  turns a bfloat16 cache's one-slot write into a conversion of the whole
  layer buffer to float32 and back on every decode step. A float32 cache
  holding the same bfloat16 keys and values is written in place and read
  as stored (the attention widens the one new query instead and rounds its
  softmax weights to bfloat16, as the bfloat16 pass does), so the sampler's
  log-probs stay as close to the teacher-forced bfloat16 pass as before;
  sums may run in another order. Twice the cache memory; bfloat16 sampling
  on CPU 1.2-1.5x faster (BENCHMARKS.md, Foundation).
  """
  dtype = jnp.dtype(param_dtype)
  backend = backend or jax.default_backend()
  if (
      backend == "cpu"
      and dtype.itemsize < 4
      and jnp.issubdtype(dtype, jnp.floating)
  ):
    return jnp.dtype(jnp.float32)
  return dtype


def model_decoder(config, options, params, tokens_BxP, mask_BxP):
  """Prefills one model's KV cache (inside jit).

  Returns (logits_BxV at each row's last real prompt token, cache, step)
  with step(prev_B, cache) -> (logits_BxV, cache) for the next token: what
  `decode` runs. Other samplers (`sat_jax.stage0.product`) combine several.
  """
  b, p = tokens_BxP.shape
  n = options.max_new_tokens
  cache_dtype = options.cache_dtype or default_cache_dtype(
      params["embed"].dtype
  )
  cache = transformer.init_cache(config, b, p + n, cache_dtype)
  if config.num_layers <= options.unroll_layers_up_to:
    # Unrolled: per-layer fused weights and per-layer cache buffers, each
    # its own loop carry (see `transformer.unstack_layers`, `KVCache`).
    params = transformer.unstack_layers(params, fuse=True)
    cache = cache.split_layers()
  # A tied head is embed.T, which XLA's CPU dot reads by widening 16-bit
  # operands to float32 (and more slowly at float32 too). Taken once here,
  # outside the decode loop, the transpose becomes a [D, V] array of its own
  # that every step reads in its dtype (tests/sampling_test.py checks the
  # compiled loop): 1.01-1.08x at float32, 1.07-1.18x at bfloat16
  # (BENCHMARKS.md, "the tied head's own copy"). Other backends read the
  # transposed operand as it is, and keep the head inside the loop, where a
  # copy would only cost memory.
  w_DxV = (
      transformer.unembed_matrix(config, params)
      if jax.default_backend() == "cpu"
      else None
  )
  h_BxPxD, cache = transformer.hidden_states_cached(
      config, params, tokens_BxP, cache, mask_BxP, prefill=True
  )
  # The last real prompt token of each row (left or right padding).
  last_B = p - 1 - jnp.argmax(mask_BxP[:, ::-1], axis=1)
  h_BxD = jnp.take_along_axis(h_BxPxD, last_B[:, None, None], axis=1)[:, 0]
  logits = transformer.logits_from_hidden(config, params, h_BxD, w_DxV)

  def step(prev_B, cache):
    h, cache = transformer.hidden_states_cached(
        config, params, prev_B[:, None], cache
    )
    return transformer.logits_from_hidden(config, params, h[:, 0], w_DxV), cache

  return logits, cache, step


def decode(first_logits_BxV, carry, step, options, key, filler_B):
  """Draws token 0 from `first_logits_BxV`, then loops (inside jit).

  step(prev_B, carry) -> (logits_BxV, carry) gives the logits of the next
  token; the loop runs until N tokens or every row is done. `filler_B`:
  rows with no real prompt token (no new tokens).
  """
  b = first_logits_BxV.shape[0]
  n = options.max_new_tokens
  token, logp = sample_from_logits(
      first_logits_BxV, jax.random.fold_in(key, 0), options
  )
  pad = jnp.int32(options.pad_token_id)
  # Filler rows are done before they start: no new token, so that they
  # never keep the decode loop running by themselves.
  token = jnp.where(filler_B, pad, token)
  logp = jnp.where(filler_B, 0.0, logp)
  tokens_BxN = jnp.full((b, n), pad).at[:, 0].set(token)
  logprobs_BxN = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logp)
  done = _is_stop(token, options) | filler_B
  lengths = (~filler_B).astype(jnp.int32)
  state = (jnp.int32(1), token, done, lengths, tokens_BxN, logprobs_BxN, carry)

  def cond(state):
    i, _, done, *_ = state
    return (i < n) & ~jnp.all(done)

  def body(state):
    i, prev, done, lengths, tokens_BxN, logprobs_BxN, carry = state
    logits, carry = step(prev, carry)
    token, logp = sample_from_logits(
        logits, jax.random.fold_in(key, i), options
    )
    token = jnp.where(done, pad, token)
    logp = jnp.where(done, 0.0, logp)
    tokens_BxN = jax.lax.dynamic_update_slice(
        tokens_BxN, token[:, None], (0, i)
    )
    logprobs_BxN = jax.lax.dynamic_update_slice(
        logprobs_BxN, logp[:, None], (0, i)
    )
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | _is_stop(token, options)
    return i + 1, token, done, lengths, tokens_BxN, logprobs_BxN, carry

  _, _, _, lengths, tokens_BxN, logprobs_BxN, _ = jax.lax.while_loop(
      cond, body, state
  )
  mask_BxN = (jnp.arange(n)[None, :] < lengths[:, None]).astype(jnp.int32)
  return SampleOutput(tokens_BxN, logprobs_BxN, mask_BxN, lengths)


def _generate(config, options, params, tokens_BxP, mask_BxP, key):
  """Prefill, then decode until N tokens or every row is done (jitted)."""
  _TRACES[0] += 1
  logits, cache, step = model_decoder(
      config, options, params, tokens_BxP, mask_BxP
  )
  filler_B = jnp.sum(mask_BxP, axis=1) == 0
  return decode(logits, cache, step, options, key, filler_B)


_generate_jit = jax.jit(_generate, static_argnums=(0, 1))


def _pad_left(tokens_BxP, mask_BxP, bucket: int, pad_id: int, xp=jnp):
  """Left-pads [B, P] int32 tokens and mask to [B, bucket]."""
  widths = ((0, 0), (bucket - tokens_BxP.shape[1], 0))
  return (
      xp.pad(tokens_BxP.astype(xp.int32), widths, constant_values=pad_id),
      xp.pad(mask_BxP.astype(xp.int32), widths),
  )


_pad_left_jit = jax.jit(_pad_left, static_argnums=(2, 3, 4))


def _left_align(
    tokens_BxP: np.ndarray, mask_BxP: np.ndarray, width: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """Each row's real tokens, in order, left-padded to `width` (host).

  The model sees the same prompts: positions count real tokens only and
  padding keys are masked, wherever the padding is. Rows must fit `width`.
  """
  tokens = np.full((tokens_BxP.shape[0], width), pad_id, np.int32)
  mask = np.zeros((tokens_BxP.shape[0], width), np.int32)
  for i, (row, real) in enumerate(zip(tokens_BxP, mask_BxP > 0)):
    ids = row[real]
    tokens[i, width - len(ids) :] = ids
    mask[i, width - len(ids) :] = 1
  return tokens, mask


def _check_prompt_ids(
    tokens_BxP: np.ndarray, mask_BxP: np.ndarray, vocab_size: int
) -> None:
  """Raises for a real (mask > 0) prompt id outside [0, vocab_size)."""
  bad_BxP = (mask_BxP > 0) & ((tokens_BxP < 0) | (tokens_BxP >= vocab_size))
  if bad_BxP.any():
    row, pos = np.argwhere(bad_BxP)[0]
    raise SamplingError(
        f"prompt token id {int(tokens_BxP[row, pos])} at row {row}, position"
        f" {pos} is outside vocab_size {vocab_size}"
    )


def sample(
    config: config_lib.ModelConfig,
    params: PyTree,
    prompt_tokens_BxP: jax.Array,
    prompt_mask_BxP: jax.Array,
    options: SamplingOptions,
    key: jax.Array,
) -> SampleOutput:
  """Samples up to `options.max_new_tokens` tokens after each prompt.

  Prompts may be left- or right-padded (left is what `pad_prompts` makes);
  P is padded up to its bucket on the left. What must fit the context is
  each row's real prompt (positions count real tokens only): where the
  bucket plus max_new_tokens N would exceed config.max_seq_len, the width
  is max_seq_len - N instead (a P wider than that is read back to the host
  and each row's real tokens re-padded to it), so the cache never holds
  more than max_seq_len slots. Raises SamplingError when a row's real
  prompt plus N exceeds max_seq_len, for out-of-vocab stop/pad ids, and for
  real prompt ids outside [0, vocab_size) in host arrays (device arrays
  are not read back to check them; their padding ids may be anything).
  Rows with an all-zero mask are batch filler: they get no new tokens.
  """
  tokens, mask = prepare_prompts(
      config, prompt_tokens_BxP, prompt_mask_BxP, options
  )
  return _generate_jit(config, options, params, tokens, mask, key)


def prepare_prompts(
    config: config_lib.ModelConfig,
    prompt_tokens_BxP: jax.Array,
    prompt_mask_BxP: jax.Array,
    options: SamplingOptions,
) -> tuple[jax.Array, jax.Array]:
  """The checks and padding of `sample`: device (tokens, mask) [B, bucket]."""
  if (
      prompt_tokens_BxP.ndim != 2
      or prompt_tokens_BxP.shape != prompt_mask_BxP.shape
  ):
    raise SamplingError(
        f"prompt tokens {prompt_tokens_BxP.shape} and mask"
        f" {prompt_mask_BxP.shape} must be equal [B, P] shapes"
    )
  for name, ids in (
      ("stop_token_ids", options.stop_token_ids),
      ("pad_token_id", (options.pad_token_id,)),
  ):
    if any(i >= config.vocab_size for i in ids):
      raise SamplingError(
          f"{name}={ids} outside vocab_size {config.vocab_size}"
      )
  n = options.max_new_tokens
  room = config.max_seq_len - n  # the longest prompt that fits
  if room < 1:
    raise SamplingError(
        f"max_new_tokens {n} leaves no room for a prompt in max_seq_len"
        f" {config.max_seq_len}"
    )
  p = prompt_tokens_BxP.shape[1]
  bucket = bucket_length(p, options.prompt_buckets)
  on_host = not isinstance(prompt_tokens_BxP, jax.Array)
  if on_host:
    tokens, mask = np.asarray(prompt_tokens_BxP), np.asarray(prompt_mask_BxP)
    _check_prompt_ids(tokens, mask, config.vocab_size)
  if bucket > room:
    bucket = room
    if p > room:  # only the real tokens must fit: read the mask (rare path)
      if not on_host:
        tokens, mask = jax.device_get((prompt_tokens_BxP, prompt_mask_BxP))
        _check_prompt_ids(tokens, mask, config.vocab_size)
        on_host = True
      real_B = np.sum(np.asarray(mask) > 0, axis=1)
      row = int(np.argmax(real_B))
      if real_B[row] > room:
        raise SamplingError(
            f"prompt of {real_B[row]} tokens (row {row}) + max_new_tokens"
            f" {n} = {real_B[row] + n} exceeds max_seq_len"
            f" {config.max_seq_len}"
        )
      tokens, mask = _left_align(
          np.asarray(tokens), np.asarray(mask), room, options.pad_token_id
      )
  if on_host:  # pad on the host, one explicit transfer
    tokens, mask = jax.device_put(
        _pad_left(tokens, mask, bucket, options.pad_token_id, np)
    )
  else:
    tokens, mask = _pad_left_jit(
        prompt_tokens_BxP, prompt_mask_BxP, bucket, options.pad_token_id
    )
  return tokens, mask
