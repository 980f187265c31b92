"""`sat-jax sample`: sample chat completions from a model; logs new tokens/s.

With no flags it builds a tiny random Qwen3 model and the tiny offline
tokenizer (`sat_jax.testing`), renders two chat prompts, samples, and logs
the completions and the speed. `--model_dir` points it at a local Hugging Face
checkpoint (tokenizer files in the same folder, or `--tokenizer_dir`).
`--bench_prompt_len N` samples from random N-token prompts instead, with no
stop tokens (a speed check), e.g.

  sat-jax sample --preset=qwen3-bench-small --bench_prompt_len=64 \\
      --batch_size=32 --max_new_tokens=64 --repeats=5

With `--workdir`, everything is written to <workdir>/samples.json.
"""

import pathlib
import tempfile
import time
from typing import Any, Sequence

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import io_utils
from sat_jax import models
from sat_jax import multihost
from sat_jax import sampling
from sat_jax import testing

_MODEL_DIR = flags.DEFINE_string(
    "model_dir", None, "Local HF checkpoint folder; default: a random model."
)
_TOKENIZER_DIR = flags.DEFINE_string(
    "tokenizer_dir", None, "Tokenizer folder (default: --model_dir)."
)
_PRESET = flags.DEFINE_string(
    "preset", "qwen3-tiny", "Preset of the random model without --model_dir."
)
_DTYPE = flags.DEFINE_enum(
    "dtype", "float32", ["float32", "bfloat16"], "Parameter dtype."
)
_PROMPTS = flags.DEFINE_multi_string(
    "prompt",
    ["What is two plus three?", "How many apples are left?"],
    "User messages, one chat prompt each.",
)
_BENCH_PROMPT_LEN = flags.DEFINE_integer(
    "bench_prompt_len", 0, "If > 0: random prompts of this length, no stops."
)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 0, "Rows per batch (0: one per prompt); prompts repeat."
)
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 32, "New tokens.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "0 is greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass (1: off).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k (0: off).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the model and the sampler.")
_REPEATS = flags.DEFINE_integer(
    "repeats", 1, "Timed runs after the compiling one."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where samples.json goes.")


def _model_and_tokenizer(tmp: pathlib.Path, dtype) -> tuple[Any, Any, Any]:
  if _MODEL_DIR.value:
    config, params = models.load_hf(_MODEL_DIR.value, dtype=dtype)
    tok_dir = _TOKENIZER_DIR.value or _MODEL_DIR.value
  else:
    config = models.get_preset(_PRESET.value)
    init = jax.jit(models.init_params, static_argnums=(0, 2))
    params = init(config, jax.random.key(_SEED.value), dtype)
    tok_dir = _TOKENIZER_DIR.value or testing.build_tiny_tokenizer(tmp / "tok")
  tokenizer = models.load_tokenizer(tok_dir)
  models.check_fits(tokenizer, config)
  return config, params, tokenizer


def _prompt_ids(tokenizer, config, batch: int) -> list[list[int]]:
  if _BENCH_PROMPT_LEN.value > 0:
    rng = np.random.default_rng(_SEED.value)
    n = len(tokenizer)
    return rng.integers(0, n, (batch, _BENCH_PROMPT_LEN.value)).tolist()
  rendered = [
      models.render_chat(tokenizer, [{"role": "user", "content": p}])
      for p in _PROMPTS.value
  ]
  return [rendered[i % len(rendered)] for i in range(batch)]


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  dtype = jnp.dtype(_DTYPE.value)
  with tempfile.TemporaryDirectory() as tmp:
    config, params, tokenizer = _model_and_tokenizer(pathlib.Path(tmp), dtype)
  batch = _BATCH_SIZE.value or (
      len(_PROMPTS.value) if _BENCH_PROMPT_LEN.value <= 0 else 1
  )
  prompts = _prompt_ids(tokenizer, config, batch)
  stops = ()
  if _BENCH_PROMPT_LEN.value <= 0:
    stops = models.stop_token_ids(tokenizer)
  options = sampling.SamplingOptions(
      max_new_tokens=_MAX_NEW_TOKENS.value,
      temperature=_TEMPERATURE.value,
      top_p=_TOP_P.value,
      top_k=_TOP_K.value,
      stop_token_ids=stops,
      pad_token_id=tokenizer.pad_token_id,
  )
  tokens, mask = sampling.pad_prompts(prompts, options)
  key = jax.random.key(_SEED.value)
  start = time.perf_counter()
  out = jax.block_until_ready(
      sampling.sample(config, params, tokens, mask, options, key)
  )
  first_s = time.perf_counter() - start
  runs_s = []
  for i in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(
        sampling.sample(
            config, params, tokens, mask, options, jax.random.fold_in(key, i)
        )
    )
    runs_s.append(time.perf_counter() - start)
  out = jax.device_get(out)
  new_tokens = int(np.sum(out.lengths_B))
  steady_s = float(np.median(runs_s)) if runs_s else first_s
  logging.info(
      "%s: batch %d, prompt bucket %d, %d new tokens; first call %.2f s"
      " (with compile), median of %d runs %.3f s: %.0f new tokens/s",
      _MODEL_DIR.value or _PRESET.value,
      batch,
      tokens.shape[1],
      new_tokens,
      first_s,
      len(runs_s),
      steady_s,
      new_tokens / steady_s,
  )
  samples = []
  for i in range(len(prompts)):
    n = int(out.lengths_B[i])
    completion = out.tokens_BxN[i, :n].tolist()
    text = tokenizer.decode(completion)
    if i < 4:
      logging.info("sample %d: %r", i, text)
    samples.append({
        "prompt_ids": prompts[i],
        "completion_ids": completion,
        "logprobs": out.logprobs_BxN[i, :n].tolist(),
        "text": text,
    })
  if _WORKDIR.value and multihost.is_primary():
    path = io_utils.local_path(_WORKDIR.value, "--workdir") / "samples.json"
    io_utils.atomic_write_json(
        path,
        {
            "model": _MODEL_DIR.value or _PRESET.value,
            "dtype": _DTYPE.value,
            "seed": _SEED.value,
            "options": {
                "max_new_tokens": options.max_new_tokens,
                "temperature": options.temperature,
                "top_p": options.top_p,
                "top_k": options.top_k,
                "stop_token_ids": list(options.stop_token_ids),
                "pad_token_id": options.pad_token_id,
            },
            "prompt_bucket": int(tokens.shape[1]),
            "samples": samples,
            "timing": {
                "first_call_s": first_s,
                "runs_s": runs_s,
                "new_tokens": new_tokens,
                "new_tokens_per_s": new_tokens / steady_s,
            },
        },
    )
    logging.info("wrote %s", path)
