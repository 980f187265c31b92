"""Tunix side of bench_foundation: its KV-cache sampler on the same workload.

Runs in .venv-tunix (benchmarks/setup_tunix_venv.sh), never in the main venv,
and imports nothing from sat_jax. Called by bench_foundation.py with the
checkpoint directory it wrote; prints one JSON object on the last line.

Two timings: `core` calls the sampler's own jitted prefill and decode
functions on token ids (what a trainer holding token ids pays), `call` is
`Sampler.__call__` end to end, with prompts passed as strings of ids through
a tokenizer stand-in (tokenisation, padding, host copies and decoding
included).
"""

import argparse
import json
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen3 import model as qwen3_model
from tunix.models.qwen3 import params as qwen3_params

_PAD_ID = 0  # Prompts avoid it: the Tunix sampler masks every pad-id token.
_NO_EOS = -1  # No token equals it, so every row runs the full length.


class IdsTokenizer:
  """Tokenizer stand-in: text is space-separated token ids."""

  def encode(self, text, **unused_kwargs):
    return [int(x) for x in text.split()]

  def decode(self, ids, **unused_kwargs):
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self):
    return None  # Falsy: Tunix then prepends no BOS.

  def eos_id(self):
    return _NO_EOS

  def pad_id(self):
    return _PAD_ID


def _model_config(ckpt: pathlib.Path, dtype) -> qwen3_model.ModelConfig:
  hf = json.loads((ckpt / "config.json").read_text())
  theta = (hf.get("rope_parameters") or {}).get("rope_theta", 1e6)
  if float(theta) != 1e6:
    raise ValueError(
        f"{ckpt}/config.json: rope_theta={theta}, but tunix 0.1.7 hard-codes"
        " 1e6 in its Qwen3 attention"
    )
  return qwen3_model.ModelConfig(
      num_layers=hf["num_hidden_layers"],
      vocab_size=hf["vocab_size"],
      embed_dim=hf["hidden_size"],
      hidden_dim=hf["intermediate_size"],
      num_heads=hf["num_attention_heads"],
      head_dim=hf["head_dim"],
      num_kv_heads=hf["num_key_value_heads"],
      rope_theta=int(theta),
      norm_eps=hf["rms_norm_eps"],
      use_tied_embedding=hf["tie_word_embeddings"],
      dtype=dtype,
      param_dtype=dtype,
  )


def _timed(fn, repeats: int, warmup: int) -> tuple[list[float], float]:
  """(steady times, first call time): `warmup` untimed calls, then repeats."""
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  for _ in range(warmup - 1):
    fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return times, first


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--ckpt", required=True, type=pathlib.Path)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--new_tokens", type=int, default=64)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
  cfg = _model_config(args.ckpt, dtype)
  # Tunix's embedding gather fails under an Explicit mesh (STACK_NOTES §7).
  mesh = jax.make_mesh(
      (1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2
  )
  with jax.set_mesh(mesh):
    model = qwen3_params.create_model_from_safe_tensors(
        str(args.ckpt), cfg, mesh, dtype=dtype
    )
    b, p, n = args.batch, args.prompt_len, args.new_tokens
    cache = sampler_lib.CacheConfig(
        cache_size=p + n,
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
    )
    sampler = sampler_lib.Sampler(model, IdsTokenizer(), cache)
    rng = np.random.default_rng(args.seed)
    prompts_BxP = rng.integers(1, cfg.vocab_size, size=(b, p), dtype=np.int32)
    sampler.eos_ids = jnp.array([_NO_EOS])
    state_params = sampler.model_def_and_state()[1]
    calls = [0]

    def core():
      calls[0] += 1
      state = sampler.init_sample_state(
          jnp.asarray(prompts_BxP),
          total_sampling_steps=p + n,
          include_logits=False,
          forbidden_token_ids=None,
          temperature=1.0,
          top_p=1.0,
          top_k=None,
          seed=jax.random.PRNGKey(calls[0]),
          beam_size=None,
      )
      state = sampler._compiled_prefill_fn(  # pylint: disable=protected-access
          state_params, state, None, echo=False
      )
      state = sampler._compiled_decode_fn(  # pylint: disable=protected-access
          state_params, state
      )
      return jax.block_until_ready(state.token_buffer)

    strings = [" ".join(map(str, row)) for row in prompts_BxP]

    def call():
      calls[0] += 1
      return sampler(
          strings,
          max_generation_steps=n,
          max_prompt_length=p,
          eos_tokens=[_NO_EOS],
          temperature=1.0,
          top_p=1.0,
          top_k=None,
          seed=calls[0],
      )

    tokens = np.asarray(core())
    new_tokens = tokens[:, p:]
    out = call()
    lengths = sorted({len(t) for t in out.tokens})
    core_times, core_first = _timed(core, args.repeats, args.warmup)
    call_times, call_first = _timed(call, args.repeats, args.warmup)

  result = {
      "side": "tunix",
      "dtype": args.dtype,
      "new_tokens_shape": list(new_tokens.shape),
      "call_output_lengths": lengths,
      "sampling": (
          "top_p=1.0, top_k=None: jax.random.categorical over the"
          " full vocabulary at temperature 1"
      ),
      "core_times_s": core_times,
      "core_first_call_s": core_first,
      "core_median_s": statistics.median(core_times),
      "call_times_s": call_times,
      "call_first_call_s": call_first,
      "call_median_s": statistics.median(call_times),
      "new_tokens": b * n,
  }
  print(json.dumps(result))


if __name__ == "__main__":
  main()
