"""Tests of the KV-cache sampler against uncached, teacher-forced references."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from sat_jax import models
from sat_jax import sampling
from sat_jax import scoring
from sat_jax import sharding
from sat_jax import testing

_CONFIG = testing.tiny_config("qwen3")
_N = 8
_PROMPTS = [[5, 17, 99], [3, 250, 42, 7, 7, 300, 12, 1, 2, 3], [100]]
_BASE = sampling.SamplingOptions(max_new_tokens=_N, prompt_buckets=(16, 32))
_forward = jax.jit(models.forward, static_argnums=0)
_sample_from_logits = jax.jit(sampling.sample_from_logits, static_argnums=2)


@functools.lru_cache(maxsize=None)
def _params():
  @jax.jit
  def init(key):
    params = models.init_params(_CONFIG, key)
    # Peakier distributions than the 0.02 init.
    return jax.tree.map(lambda x: x * 5 if x.ndim >= 3 else x, params)

  return init(jax.random.key(0))


def _prompt_batch(options=_BASE):
  return sampling.pad_prompts(_PROMPTS, options)


def _teacher_forced_logits(tokens_BxP, mask_BxP, out):
  """Logits that predicted each new token, from one uncached forward."""
  full = np.concatenate([tokens_BxP, out.tokens_BxN], 1)
  mask = np.concatenate([mask_BxP, out.mask_BxN], 1)
  logits = _forward(_CONFIG, _params(), full, mask)
  p = tokens_BxP.shape[1]
  return logits[:, p - 1 : -1]


@jax.jit
def _uncached_logits(params, buf_BxT, mask_BxT, slot):
  logits = models.forward(_CONFIG, params, buf_BxT, mask_BxT)
  return jax.lax.dynamic_index_in_dim(logits, slot, 1, keepdims=False)


def _uncached_sample(tokens_BxP, mask_BxP, options, key):
  """Reference: full forward over a growing sequence at every step."""
  b, p = tokens_BxP.shape
  buf = np.concatenate([tokens_BxP, np.zeros((b, _N), np.int32)], 1)
  mask = np.concatenate([mask_BxP, np.zeros((b, _N), np.int32)], 1)
  toks, logps = [], []
  for i in range(_N):
    logits = _uncached_logits(_params(), buf, mask, p - 1 + i)
    tok, logp = _sample_from_logits(logits, jax.random.fold_in(key, i), options)
    buf[:, p + i], mask[:, p + i] = np.asarray(tok), 1
    toks.append(np.asarray(tok))
    logps.append(np.asarray(logp))
  return np.stack(toks, 1), np.stack(logps, 1)


def test_greedy_equals_step_by_step_argmax():
  tokens, mask = _prompt_batch()
  options = dataclasses.replace(_BASE, temperature=0.0)
  out = sampling.sample(
      _CONFIG, _params(), tokens, mask, options, jax.random.key(0)
  )
  ref_tokens, _ = _uncached_sample(tokens, mask, options, jax.random.key(0))
  np.testing.assert_array_equal(out.tokens_BxN, ref_tokens)
  logits = _teacher_forced_logits(tokens, mask, out)
  np.testing.assert_array_equal(out.tokens_BxN, np.argmax(logits, -1))
  # Greedy log-probs are those of the plain model distribution.
  logp = jax.nn.log_softmax(logits, -1)
  np.testing.assert_allclose(
      out.logprobs_BxN,
      np.take_along_axis(logp, out.tokens_BxN[..., None], -1)[..., 0],
      atol=1e-5,
  )
  assert out.lengths_B.tolist() == [_N] * 3 and out.mask_BxN.all()


def test_logprobs_equal_teacher_forced_log_softmax():
  tokens, mask = _prompt_batch()
  out = sampling.sample(
      _CONFIG, _params(), tokens, mask, _BASE, jax.random.key(1)
  )
  logp = jax.nn.log_softmax(_teacher_forced_logits(tokens, mask, out), -1)
  ref = np.take_along_axis(logp, out.tokens_BxN[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.logprobs_BxN, ref, atol=1e-5)
  assert len(np.unique(out.tokens_BxN)) > 10  # it really samples


def test_no_implicit_host_transfers():
  tokens, mask = sampling.pad_prompts(_PROMPTS, _BASE, length=11)
  params, key = _params(), jax.random.key(1)
  with jax.transfer_guard("disallow"):
    out = sampling.sample(_CONFIG, params, tokens, mask, _BASE, key)
    device_tokens, device_mask = jax.device_put((tokens, mask))
    again = sampling.sample(
        _CONFIG, params, device_tokens, device_mask, _BASE, key
    )
    np.testing.assert_array_equal(
        jax.device_get(out.tokens_BxN), jax.device_get(again.tokens_BxN)
    )


def test_sharded_sampling_equals_unsharded():
  mesh = jax.make_mesh(
      (2, 2, 2),
      ("data", "fsdp", "tensor"),
      axis_types=(jax.sharding.AxisType.Auto,) * 3,
  )
  params_shardings = jax.tree.map(
      lambda names: NamedSharding(mesh, sharding.logical_to_spec(names)),
      models.param_axes(_CONFIG),
      is_leaf=lambda x: isinstance(x, tuple),
  )
  tokens, mask = sampling.pad_prompts(_PROMPTS + [[8, 9]], _BASE)
  options, key = dataclasses.replace(_BASE, temperature=0.0), jax.random.key(0)
  ref = sampling.sample(_CONFIG, _params(), tokens, mask, options, key)
  rows = NamedSharding(mesh, P(("data", "fsdp"), None))
  with jax.set_mesh(mesh):
    out = sampling.sample(
        _CONFIG,
        jax.device_put(_params(), params_shardings),
        jax.device_put(tokens, rows),
        jax.device_put(mask, rows),
        options,
        key,
    )
  assert out.tokens_BxN.sharding.spec == P(("data", "fsdp"))
  np.testing.assert_array_equal(out.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_allclose(out.logprobs_BxN, ref.logprobs_BxN, atol=1e-5)


def test_cached_and_uncached_sampling_agree_with_filters():
  tokens, mask = _prompt_batch()
  options = dataclasses.replace(_BASE, temperature=0.7, top_k=40, top_p=0.8)
  key = jax.random.key(2)
  out = sampling.sample(_CONFIG, _params(), tokens, mask, options, key)
  ref_tokens, ref_logps = _uncached_sample(tokens, mask, options, key)
  np.testing.assert_array_equal(out.tokens_BxN, ref_tokens)
  np.testing.assert_allclose(out.logprobs_BxN, ref_logps, atol=1e-5)
  # Teacher forcing through the filtered distribution gives the same numbers.
  logp = sampling.filtered_log_probs(
      _teacher_forced_logits(tokens, mask, out).reshape(-1, 512), options
  ).reshape(3, _N, 512)
  ref = np.take_along_axis(logp, out.tokens_BxN[..., None], -1)[..., 0]
  np.testing.assert_allclose(out.logprobs_BxN, ref, atol=1e-5)
  assert np.all(out.logprobs_BxN < 0) and np.all(np.isfinite(out.logprobs_BxN))


def test_default_cache_dtype():
  f32, bf16, f16 = jnp.dtype(jnp.float32), jnp.bfloat16, jnp.float16
  assert sampling.default_cache_dtype(bf16, "cpu") == f32
  assert sampling.default_cache_dtype(f16, "cpu") == f32
  assert sampling.default_cache_dtype(f32, "cpu") == f32
  assert sampling.default_cache_dtype(bf16, "gpu") == jnp.dtype(bf16)
  assert sampling.default_cache_dtype(bf16, "tpu") == jnp.dtype(bf16)


def test_the_sampler_uses_the_default_cache_dtype(monkeypatch):
  made = []
  init_cache = models.transformer.init_cache

  def recording_init_cache(config, batch, num_slots, dtype):
    made.append(jnp.dtype(dtype))
    return init_cache(config, batch, num_slots, dtype)

  monkeypatch.setattr(models.transformer, "init_cache", recording_init_cache)
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _params())
  tokens, mask = _prompt_batch()
  # A max_new_tokens of its own, so that this call traces afresh.
  for cache_dtype in (None, "bfloat16"):
    options = dataclasses.replace(
        _BASE, max_new_tokens=3, cache_dtype=cache_dtype
    )
    sampling.sample(_CONFIG, params, tokens, mask, options, jax.random.key(0))
  assert made == [jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU copy")
def test_the_decode_loop_reads_a_tied_head_in_bfloat16():
  # XLA's CPU dot widens a transposed 16-bit operand (the tied embed.T) to
  # float32; the head the sampler takes once before the loop is a [D, V]
  # array of its own, which keeps the decode step's head matmul in
  # bfloat16. Checked in the compiled HLO: the operands of the head's dot
  # inside the while loop.
  config = _CONFIG.replace(num_layers=1)
  params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
  tokens = jnp.ones((4, 8), jnp.int32)
  options = dataclasses.replace(_BASE, max_new_tokens=2)
  hlo = (
      sampling._generate_jit.lower(  # pylint: disable=protected-access
          config, options, params, tokens, tokens, jax.random.key(0)
      )
      .compile()
      .as_text()
  )
  decode_head_operands, computation = [], ""
  for line in hlo.splitlines():
    if line.startswith(("%", "ENTRY")):
      computation = line  # the header names the operands' types
    if " dot(" in line and "while/body/...d,dv->...v" in line:
      decode_head_operands.append(computation.split("->")[0])
  assert config.tie_embeddings and len(decode_head_operands) == 1
  d, v = config.hidden_size, config.vocab_size
  assert f"bf16[{d},{v}]" in decode_head_operands[0]
  assert "f32[" not in decode_head_operands[0]


def test_a_float32_cache_of_bfloat16_params_samples_as_a_bfloat16_cache():
  # The float32 cache (the CPU default for 16-bit params) stores the same
  # bfloat16 keys and values; the attention widens the query and rounds
  # its softmax weights to bfloat16 as the bfloat16 path does. On this
  # tiny model the two agree bit for bit (larger contractions may sum in
  # another order); without the rounding they would not.
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _params())
  tokens, mask = _prompt_batch()
  out = {}
  for dtype in ("bfloat16", "float32"):
    options = dataclasses.replace(_BASE, cache_dtype=dtype)
    out[dtype] = sampling.sample(
        _CONFIG, params, tokens, mask, options, jax.random.key(1)
    )
  np.testing.assert_array_equal(
      out["float32"].tokens_BxN, out["bfloat16"].tokens_BxN
  )
  np.testing.assert_allclose(
      out["float32"].logprobs_BxN, out["bfloat16"].logprobs_BxN, atol=1e-6
  )
  # Both within bfloat16 rounding of the teacher-forced bfloat16 pass.
  full = np.concatenate([tokens, out["float32"].tokens_BxN], 1)
  full_mask = np.concatenate([mask, out["float32"].mask_BxN], 1)
  logits = _forward(_CONFIG, params, full, full_mask)[
      :, tokens.shape[1] - 1 : -1
  ]
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
  ref = np.take_along_axis(logp, out["float32"].tokens_BxN[..., None], -1)
  np.testing.assert_allclose(
      out["float32"].logprobs_BxN, ref[..., 0], atol=5e-3
  )


def test_a_row_that_hits_a_stop_token_stops_and_is_padded():
  tokens, mask = _prompt_batch()
  greedy = dataclasses.replace(_BASE, temperature=0.0)
  free = sampling.sample(
      _CONFIG, _params(), tokens, mask, greedy, jax.random.key(0)
  )
  free_tokens = np.asarray(free.tokens_BxN)
  stop = int(free_tokens[0, 2])
  first = {
      r: list(free_tokens[r]).index(stop)
      for r in range(3)
      if stop in free_tokens[r]
  }
  options = dataclasses.replace(
      greedy, stop_token_ids=(stop, 511), pad_token_id=1
  )
  out = sampling.sample(
      _CONFIG, _params(), tokens, mask, options, jax.random.key(0)
  )
  for r in range(3):
    n = first.get(r, _N - 1) + 1
    assert int(out.lengths_B[r]) == n
    np.testing.assert_array_equal(out.tokens_BxN[r, :n], free_tokens[r, :n])
    np.testing.assert_array_equal(out.tokens_BxN[r, n:], 1)
    np.testing.assert_array_equal(out.mask_BxN[r], np.arange(_N) < n)
    np.testing.assert_array_equal(out.logprobs_BxN[r, n:], 0.0)
  assert int(out.lengths_B[0]) == 3


def test_one_trace_per_bucket_across_calls():
  options = dataclasses.replace(_BASE, temperature=0.9)
  params = _params()
  before = sampling.num_traces()
  for i, prompts in enumerate([[[1, 2]], [[3] * 9], [[4] * 16]]):
    tokens, mask = sampling.pad_prompts(prompts * 3, options)
    assert tokens.shape == (3, 16)
    other = jax.tree.map(lambda x, i=i: x * (1 + i), params)  # new values
    sampling.sample(_CONFIG, other, tokens, mask, options, jax.random.key(i))
  assert sampling.num_traces() == before + 1
  # Unbucketed input is padded up to its bucket: still no new trace.
  tokens, mask = sampling.pad_prompts([[5] * 4] * 3, options, length=11)
  sampling.sample(_CONFIG, params, tokens, mask, options, jax.random.key(9))
  assert sampling.bucket_length(17, options.prompt_buckets) == 32
  assert sampling.num_traces() == before + 1


def _numpy_filter(logits, temperature, top_k, top_p):
  """Independent sort-based reference of the filtered log-probs."""
  x = logits.astype(np.float64) / temperature
  out = np.full_like(x, -np.inf)
  for r in range(x.shape[0]):
    order = np.argsort(-x[r])
    keep = order[:top_k] if top_k else order
    p = np.exp(x[r, keep] - x[r, keep].max())
    p /= p.sum()
    cut = np.searchsorted(np.cumsum(p), top_p - 1e-12) + 1  # mass >= top_p
    keep = keep[: min(cut, len(keep))]
    z = x[r, keep] - x[r, keep].max()
    out[r, keep] = z - np.log(np.exp(z).sum())
  return out


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [
        (1.0, 0, 1.0),
        (0.5, 0, 1.0),
        (1.0, 7, 1.0),
        (1.0, 0, 0.6),
        (0.8, 12, 0.7),
    ],
)
def test_filtered_log_probs_match_a_sort_based_reference(
    temperature, top_k, top_p
):
  logits = np.random.default_rng(3).normal(0, 2, (5, 60)).astype(np.float32)
  options = sampling.SamplingOptions(
      temperature=temperature, top_k=top_k, top_p=top_p
  )
  got = np.asarray(sampling.filtered_log_probs(jnp.asarray(logits), options))
  ref = _numpy_filter(logits, temperature, top_k, top_p)
  np.testing.assert_array_equal(np.isfinite(got), np.isfinite(ref))
  np.testing.assert_allclose(
      got[np.isfinite(ref)], ref[np.isfinite(ref)], atol=1e-5
  )


@pytest.mark.parametrize("vocab", [300, 512])
def test_draws_follow_the_distribution(vocab):
  rng = np.random.default_rng(4)
  probs = np.where(rng.random(vocab) < 0.2, rng.random(vocab), 0.0)
  probs[vocab - 1] = 0.0
  probs /= probs.sum()
  rows = 40_000
  logits = jnp.log(jnp.asarray(np.tile(probs, (rows, 1)), jnp.float32))
  tokens, logps = _sample_from_logits(
      logits, jax.random.key(5), sampling.SamplingOptions()
  )
  freq = np.bincount(np.asarray(tokens), minlength=vocab) / rows
  assert freq[probs == 0].sum() == 0
  assert np.abs(freq - probs).max() < 4 * np.sqrt(probs.max() / rows)
  np.testing.assert_allclose(
      logps, np.log(probs[np.asarray(tokens)]), atol=1e-5
  )


def test_pad_prompts():
  options = sampling.SamplingOptions(pad_token_id=9, prompt_buckets=(4, 8))
  tokens, mask = sampling.pad_prompts(
      [[1, 2], [3, 4, 5, 6, 7]], options, batch_size=3
  )
  np.testing.assert_array_equal(
      tokens,
      [[9, 9, 9, 9, 9, 9, 1, 2], [9, 9, 9, 3, 4, 5, 6, 7], [9] * 8],
  )
  np.testing.assert_array_equal(mask, tokens != 9)
  assert tokens.dtype == np.int32
  with pytest.raises(
      sampling.SamplingError, match="longer than the largest bucket 8"
  ):
    sampling.pad_prompts([[1] * 9], options)
  with pytest.raises(sampling.SamplingError, match="prompt 1 is empty"):
    sampling.pad_prompts([[1], []], options)
  with pytest.raises(sampling.SamplingError, match="exceed batch_size=1"):
    sampling.pad_prompts([[1], [2]], options, batch_size=1)


def test_prompt_plus_new_tokens_longer_than_context():
  config = _CONFIG.replace(max_seq_len=40)
  options = dataclasses.replace(_BASE, max_new_tokens=10)
  # 31 real tokens (width 32) + 10 = 41: the real length is what is named.
  tokens, mask = sampling.pad_prompts([[2], [1] * 31], options)
  with pytest.raises(
      sampling.SamplingError,
      match=(
          r"prompt of 31 tokens \(row 1\) \+ max_new_tokens 10 = 41 exceeds"
          " max_seq_len 40"
      ),
  ):
    sampling.sample(config, _params(), tokens, mask, options, jax.random.key(0))
  full = dataclasses.replace(_BASE, max_new_tokens=40)
  with pytest.raises(sampling.SamplingError, match="leaves no room"):
    sampling.sample(config, _params(), tokens, mask, full, jax.random.key(0))
  bad = dataclasses.replace(_BASE, stop_token_ids=(512,))
  with pytest.raises(sampling.SamplingError, match="outside vocab_size 512"):
    sampling.sample(_CONFIG, _params(), tokens, mask, bad, jax.random.key(0))


def test_a_prompt_that_fits_is_sampled_whatever_its_bucket(monkeypatch):
  # 70 real tokens + 20 new = 90 <= max_seq_len 100, though pad_prompts
  # gives a width of 128 (their bucket): the sampler takes the context's
  # room, 100 - 20 = 80, as the width (a cache of 100 slots), and
  # re-pads a wider input's real tokens to it.
  config = _CONFIG.replace(max_seq_len=100)
  options = sampling.SamplingOptions(max_new_tokens=20, temperature=0.0)
  prompt = np.random.default_rng(0).integers(1, 500, 70).tolist()
  slots = []
  init_cache = models.transformer.init_cache

  def recording_init_cache(config, batch, num_slots, dtype):
    slots.append(num_slots)
    return init_cache(config, batch, num_slots, dtype)

  monkeypatch.setattr(models.transformer, "init_cache", recording_init_cache)
  key, params = jax.random.key(0), _params()
  tokens, mask = sampling.pad_prompts([prompt], options)
  assert tokens.shape == (1, 128)
  out = sampling.sample(config, params, tokens, mask, options, key)
  assert slots == [100]
  # The same prompt padded to the room by the caller, or right-padded to
  # 128 on the device, or left-padded to 75 (its bucket, 128, too wide),
  # samples exactly the same.
  right = np.zeros((1, 128), np.int32)
  right[0, :70] = prompt
  others = [
      sampling.pad_prompts([prompt], options, length=80),
      jax.device_put((right, (right > 0).astype(np.int32))),
      sampling.pad_prompts([prompt], options, length=75),
  ]
  for t, m in others:
    again = sampling.sample(config, params, t, m, options, key)
    np.testing.assert_array_equal(again.tokens_BxN, out.tokens_BxN)
    np.testing.assert_array_equal(again.logprobs_BxN, out.logprobs_BxN)
  assert slots == [100]  # one shape, one trace
  # Greedy against one uncached forward over the 90 tokens.
  full = np.asarray([prompt + out.tokens_BxN[0].tolist()])
  logits = _forward(config, params, full, np.ones_like(full))[0, 69:-1]
  np.testing.assert_array_equal(out.tokens_BxN[0], np.argmax(logits, -1))
  logp = jax.nn.log_softmax(logits, -1)
  np.testing.assert_allclose(
      out.logprobs_BxN[0],
      np.take_along_axis(logp, out.tokens_BxN[0][:, None], -1)[:, 0],
      atol=1e-5,
  )
  assert out.lengths_B.tolist() == [20]


def test_out_of_vocab_prompt_ids_are_named_and_padding_ids_ignored():
  for prompts, message in (
      ([[5, 600, 7], [1, 2]], "id 600 at row 0, position 14 is outside"),
      ([[5, 2], [3, -3, 7]], "id -3 at row 1, position 14 is outside"),
  ):
    tokens, mask = sampling.pad_prompts(prompts, _BASE)
    with pytest.raises(sampling.SamplingError, match=message):
      sampling.sample(
          _CONFIG, _params(), tokens, mask, _BASE, jax.random.key(0)
      )
  # Ids at padding (mask 0) are never looked up: a batch whose padding
  # holds ids far outside the vocabulary samples exactly as with id 0 there
  # (host arrays, and device arrays, which are not checked).
  tokens, mask = _prompt_batch()
  ref = sampling.sample(
      _CONFIG, _params(), tokens, mask, _BASE, jax.random.key(3)
  )
  odd = np.where(mask > 0, tokens, 10**6).astype(np.int32)
  for t, m in ((odd, mask), jax.device_put((odd, mask))):
    out = sampling.sample(_CONFIG, _params(), t, m, _BASE, jax.random.key(3))
    np.testing.assert_array_equal(out.tokens_BxN, ref.tokens_BxN)
    np.testing.assert_array_equal(out.logprobs_BxN, ref.logprobs_BxN)
  assert np.all(np.isfinite(ref.logprobs_BxN))


def test_filler_rows_get_no_tokens_and_stop_no_loop(monkeypatch):
  # The one real row stops at its first token, so the decode loop has
  # nothing to do; filler rows (all-zero masks) must not keep it running.
  # Decode steps are counted in the compiled loop (a max_new_tokens of its
  # own traces afresh, with the counter in).
  greedy = dataclasses.replace(_BASE, max_new_tokens=13, temperature=0.0)
  tokens, mask = sampling.pad_prompts([[5, 17, 99]], greedy)
  first = int(
      sampling.sample(
          _CONFIG, _params(), tokens, mask, greedy, jax.random.key(0)
      ).tokens_BxN[0, 0]
  )
  steps = []
  cached = models.transformer.hidden_states_cached

  def counting(*args, prefill=False, **kwargs):
    if not prefill:
      jax.debug.callback(lambda: steps.append(1))
    return cached(*args, prefill=prefill, **kwargs)

  monkeypatch.setattr(models.transformer, "hidden_states_cached", counting)
  options = dataclasses.replace(greedy, stop_token_ids=(first,), pad_token_id=7)
  tokens, mask = sampling.pad_prompts([[5, 17, 99]], options, batch_size=3)
  out = sampling.sample(
      _CONFIG, _params(), tokens, mask, options, jax.random.key(0)
  )
  jax.effects_barrier()
  assert not steps
  assert out.lengths_B.tolist() == [1, 0, 0]
  assert int(out.tokens_BxN[0, 0]) == first
  np.testing.assert_array_equal(out.tokens_BxN[:, 1:], 7)
  np.testing.assert_array_equal(out.tokens_BxN[1:], 7)
  np.testing.assert_array_equal(out.mask_BxN[1:], 0)
  np.testing.assert_array_equal(out.logprobs_BxN[1:], 0.0)
  assert float(out.logprobs_BxN[0, 0]) < 0


def test_a_block_start_rounded_up_never_draws_a_zero_probability_token():
  # V = 192 in 3 blocks of 64. Token 0 (block 0) has mass a, token 65
  # (block 1) mass 1, every other token 0: block 1's entry 0 (token 64)
  # has probability 0. The block CDF is [a, fl(1 + a), fl(1 + a)], and
  # block 1's start recomputed as fl(1 + a) - 1 = 2501 * 2**-23 lies above
  # a = 2500.6 * 2**-23. A u in between picks block 1 (u >= a), with
  # u - start < 0 inside it.
  a = np.float32(2500.6 * 2.0**-23)
  total = np.float32(1) + a
  assert total - np.float32(1) == np.float32(2501 * 2.0**-23)
  probs = np.zeros((1, 192), np.float32)
  probs[0, 0], probs[0, 65] = a, 1.0
  # Every uniform k * 2**-23 around the gap; the exact inverse CDF draws
  # token 0 where u = fl(uniform * total) < a, else token 65.
  uniforms = np.arange(2490, 2511, dtype=np.float32) * np.float32(2.0**-23)
  u = uniforms * total
  assert np.sum((u >= a) & (u < total - 1)) == 1  # k = 2500 falls in it
  tokens = sampling._inverse_cdf(  # pylint: disable=protected-access
      jnp.asarray(np.tile(probs, (len(uniforms), 1))), jnp.asarray(uniforms)
  )
  np.testing.assert_array_equal(tokens, np.where(u < a, 0, 65))


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_new_tokens", 0),
        ("temperature", -1.0),
        ("temperature", 1e-40),  # logits / 1e-40 overflow to inf -> NaN
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_k", -2),
        ("prompt_buckets", (8, 4)),
    ],
)
def test_bad_options_name_the_field(field, value):
  with pytest.raises(sampling.SamplingError, match=field):
    sampling.SamplingOptions(**{field: value})


def test_smallest_temperature_keeps_the_distribution_finite():
  # At the floor, logits of a size no model produces still divide to finite
  # values, and the sampling distribution is (numerically) the argmax.
  options = sampling.SamplingOptions(temperature=scoring.MIN_TEMPERATURE)
  logits = jnp.asarray([[3e4, -3e4, 2.9e4, 0.0]], jnp.float32)
  logp = np.asarray(sampling.filtered_log_probs(logits, options))
  assert np.isfinite(logp[0, 0]) and logp[0, 0] == 0.0
  assert np.all(np.exp(logp[0, 1:]) == 0.0)
