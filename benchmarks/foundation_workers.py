"""Measurement workers of bench_foundation.py, one fresh process per call.

    python benchmarks/foundation_workers.py KIND --args JSON --out FILE

KIND is `roofline` (jitted 2048x2048 f32 matmul), `sat` (sat_jax sampler
and scoring), `torch` (transformers generate and scoring) or `memory` (peak
memory of log-prob + KL, chunked or naive). Each writes one JSON object to
FILE. A fresh process per measurement keeps the sides apart (torch's OpenMP
threads spin after each op and would steal cores from XLA) and makes the
RSS high-water mark of a memory variant its own.
"""

import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import sys
import time

import numpy as np

_REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_REPO))


def timed(fn, repeats: int, warmup: int = 1) -> dict:
  """Times `fn()` (which must block until done): warm-up calls, then repeats."""
  return timed_interleaved((fn,), repeats, warmup)[0]


def timed_interleaved(fns, repeats: int, warmup: int = 1) -> list[dict]:
  """`timed` for several calls, one of each per round (drift hits all)."""
  first = []
  for fn in fns:
    t0 = time.perf_counter()
    fn()
    first.append(time.perf_counter() - t0)
    for _ in range(warmup - 1):
      fn()
  times = [[] for _ in fns]
  for _ in range(repeats):
    for fn, ts in zip(fns, times):
      t0 = time.perf_counter()
      fn()
      ts.append(time.perf_counter() - t0)
  return [
      {"times_s": ts, "median_s": statistics.median(ts), "first_call_s": f}
      for ts, f in zip(times, first)
  ]


def _maxrss_bytes() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _status_bytes(field: str) -> int | None:
  """VmRSS / VmHWM of this process from /proc (None where unavailable)."""
  try:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
      if line.startswith(field + ":"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _reset_peak_rss() -> bool:
  """Resets VmHWM to the current RSS (Linux >= 4.0); False if not allowed."""
  try:
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    return True
  except OSError:
    return False


def _mem_available_bytes() -> int | None:
  try:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
      if line.startswith("MemAvailable:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _workload(args: dict):
  rng = np.random.default_rng(args["seed"])
  b, p, n, v = (
      args["batch"],
      args["prompt_len"],
      args["new_tokens"],
      args["vocab"],
  )
  # Ids from 1: id 0 is the pad id of the Tunix side, which masks it.
  prompts_BxP = rng.integers(1, v, size=(b, p), dtype=np.int32)
  seqs_BxT = rng.integers(1, v, size=(b, p + n), dtype=np.int32)
  return prompts_BxP, seqs_BxT


def roofline(args: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  n = args.get("size", 2048)
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(k1, (n, n), jnp.float32)
  b = jax.random.normal(k2, (n, n), jnp.float32)
  f = jax.jit(jnp.dot)
  t = timed(lambda: f(a, b).block_until_ready(), args.get("repeats", 20), 3)
  t["flops"] = 2 * n**3
  t["flop_per_s"] = t["flops"] / t["median_s"]
  # The bfloat16 rows' reference: the model's own kind of matmul, bfloat16
  # operands with float32 accumulation (native on CPUs with AVX512-BF16).
  a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  f16 = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  t16 = timed(
      lambda: f16(a16, b16).block_until_ready(), args.get("repeats", 20), 3
  )
  t16["flop_per_s"] = t["flops"] / t16["median_s"]
  t["bfloat16"] = t16
  return t


def sat(args: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import sampling  # pylint: disable=g-import-not-at-top
  from sat_jax import scoring  # pylint: disable=g-import-not-at-top

  devices = args.get("sampler_devices", 1)
  if devices > 1:  # before the CPU backend starts
    jax.config.update("jax_num_cpu_devices", devices)
  dtype = jnp.dtype(args["dtype"])
  config, params = models.load_hf(args["ckpt"], dtype=dtype)
  prompts_BxP, seqs_BxT = _workload(args)
  n = args["new_tokens"]
  options = sampling.SamplingOptions(
      max_new_tokens=n, temperature=1.0, top_p=1.0, top_k=0, stop_token_ids=()
  )
  prompts = jnp.asarray(prompts_BxP)
  prompt_mask = jnp.ones_like(prompts)
  calls = [0]

  def sample():
    calls[0] += 1
    out = sampling.sample(
        config, params, prompts, prompt_mask, options, jax.random.key(calls[0])
    )
    return jax.block_until_ready(out)

  out = sample()
  assert out.tokens_BxN.shape == (prompts.shape[0], n), out.tokens_BxN.shape
  assert int(out.lengths_B.min()) == n, "a row stopped early"
  result = {"side": "sat_jax", "dtype": args["dtype"]}
  if devices == 1:
    result["sampler"] = timed(sample, args["repeats"])
  else:
    sample_dp, same = _sampler_on_devices(config, params, prompts, options)
    result["sampler_devices"] = devices
    result["sampler_same_tokens"] = same
    result["sampler"], result["sampler_multi"] = timed_interleaved(
        (sample, sample_dp), args["repeats"]
    )

  seqs = jnp.asarray(seqs_BxT)
  seq_mask = jnp.ones_like(seqs)
  score_fn = jax.jit(
      lambda p, t, m: scoring.token_logprobs(
          config, p, t, m, 1.0, args["chunk_size"]
      )
  )
  logp = score_fn(params, seqs, seq_mask)
  result["scoring"] = timed(
      lambda: score_fn(params, seqs, seq_mask).block_until_ready(),
      args["repeats"],
  )
  np.save(args["logp_out"], np.asarray(logp))
  return result


def _sampler_on_devices(config, params, prompts, options):
  """`sampling.sample` with its rows over every device (one data mesh).

  Returns (a timed call like `sat`'s `sample`, whether it draws the same
  tokens as one device for the same key).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import sampling  # pylint: disable=g-import-not-at-top
  from sat_jax import sharding  # pylint: disable=g-import-not-at-top

  mesh = sharding.make_mesh(sharding.MeshConfig())
  placed = jax.device_put(
      params,
      sharding.logical_to_sharding(
          models.param_axes(config), mesh, shapes=params
      ),
  )
  rows = jax.device_put(prompts, NamedSharding(mesh, PartitionSpec("data")))
  mask = jax.numpy.ones_like(rows)
  key = jax.device_put(jax.random.key(0), NamedSharding(mesh, PartitionSpec()))
  calls = [0]

  def sample_dp():
    calls[0] += 1
    k = jax.random.fold_in(key, calls[0])
    out = sampling.sample(config, placed, rows, mask, options, k)
    return jax.block_until_ready(out)

  one = sampling.sample(
      config, params, prompts, jax.numpy.ones_like(prompts), options,
      jax.random.key(0),
  )  # fmt: skip
  many = sampling.sample(config, placed, rows, mask, options, key)
  same = bool((np.asarray(one.tokens_BxN) == np.asarray(many.tokens_BxN)).all())
  return sample_dp, same


def torch_side(args: dict) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(args["threads"])
  dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args["dtype"]]
  model = transformers.Qwen3ForCausalLM.from_pretrained(
      args["ckpt"], dtype=dtype
  ).eval()
  prompts_BxP, seqs_BxT = _workload(args)
  n = args["new_tokens"]
  prompts = torch.as_tensor(prompts_BxP, dtype=torch.long)
  attn = torch.ones_like(prompts)
  calls = [0]

  def generate():
    calls[0] += 1
    torch.manual_seed(calls[0])
    with torch.inference_mode():
      return model.generate(
          input_ids=prompts,
          attention_mask=attn,
          do_sample=True,
          temperature=1.0,
          top_k=0,
          top_p=1.0,
          max_new_tokens=n,
          min_new_tokens=n,
          use_cache=True,
          pad_token_id=0,
      )

  out = generate()
  assert tuple(out.shape) == (prompts.shape[0], prompts.shape[1] + n), out.shape
  result = {
      "side": "transformers",
      "dtype": args["dtype"],
      "threads": torch.get_num_threads(),
  }
  result["sampler"] = timed(generate, args["repeats"])

  seqs = torch.as_tensor(seqs_BxT, dtype=torch.long)

  def score():
    with torch.inference_mode():
      logits = model(input_ids=seqs).logits.float()
      logq = torch.log_softmax(logits[:, :-1], dim=-1)
      return torch.gather(logq, -1, seqs[:, 1:, None])[..., 0]

  logp = score()
  result["scoring"] = timed(score, args["repeats"])
  np.save(args["logp_out"], np.pad(logp.numpy(), ((0, 0), (1, 0))))
  return result


def memory(args: dict) -> dict:
  """Peak memory of one jitted log-prob + KL call (or its gradient)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import scoring  # pylint: disable=g-import-not-at-top

  cfg = models.ModelConfig(**args["model"])
  b, t = args["batch"], args["length"]
  p_new = models.init_params(cfg, jax.random.PRNGKey(0))
  p_old = models.init_params(cfg, jax.random.PRNGKey(1))
  tokens = jax.random.randint(jax.random.PRNGKey(2), (b, t), 0, cfg.vocab_size)
  mask = jnp.ones((b, t), jnp.int32)

  # The gradient variants recompute each layer in the backward pass (as a
  # trainer would), so that the body's activations do not hide the head's.
  remat = bool(args["grad"])
  c = args["chunk_size"]

  def chunked(pn, po, tok, m):
    logp = scoring.token_logprobs(cfg, pn, tok, m, 1.0, c, remat=remat)
    kl = scoring.state_kl(cfg, pn, cfg, po, tok, m, 1.0, c, remat=remat)
    return logp, kl

  def naive(pn, po, tok, m):
    logits_new = models.forward(cfg, pn, tok, m, remat=remat)
    logq_new = jax.nn.log_softmax(logits_new, axis=-1)
    logq_old = jax.nn.log_softmax(models.forward(cfg, po, tok, m), axis=-1)
    logp = jnp.take_along_axis(logq_new[:, :-1], tok[:, 1:, None], -1)[..., 0]
    kl = jnp.sum(jnp.exp(logq_new) * (logq_new - logq_old), -1)[:, :-1]
    return logp, kl

  fn = {"chunked": chunked, "naive": naive}[args["variant"]]
  if args["grad"]:
    fwd = fn
    fn = jax.grad(
        lambda pn, po, tok, m: sum(x.sum() for x in fwd(pn, po, tok, m))
    )
  # Peak RSS of compile + run alone: the high-water mark is reset after the
  # params exist (their random init has large temporaries of its own).
  reset = _reset_peak_rss()
  rss_base = _status_bytes("VmRSS")
  compiled = jax.jit(fn).lower(p_new, p_old, tokens, mask).compile()
  ma = compiled.memory_analysis()
  est = {
      "temp_bytes": ma.temp_size_in_bytes,
      "argument_bytes": ma.argument_size_in_bytes,
      "output_bytes": ma.output_size_in_bytes,
  }
  est["total_bytes"] = sum(est.values())
  result = {"variant": args["variant"], "grad": args["grad"], "xla": est}
  result["remat"] = remat
  result["chunk_size"] = c
  result["full_logits_bytes"] = b * t * cfg.vocab_size * 4
  result["rss_base_bytes"] = rss_base
  # XLA's CPU estimate was 2-3.5x below the measured peak of the naive
  # variants; run only where even 3.5x the estimate fits in free memory, so
  # a shared machine is not pushed into the OOM killer.
  avail = _mem_available_bytes()
  need = 3.5 * est["total_bytes"]
  limit = args.get("run_limit_bytes") or (avail and avail - 2 * 2**30)
  result["run_limit_bytes"] = limit
  if limit and need > limit:
    result["ran"] = False
    return result
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(p_new, p_old, tokens, mask))
  result["run_s"] = time.perf_counter() - t0
  result["ran"] = True
  hwm = _status_bytes("VmHWM") if reset else None
  result["peak_rss_bytes"] = hwm if hwm is not None else _maxrss_bytes()
  result["peak_rss_source"] = "VmHWM after reset" if hwm else "ru_maxrss"
  return result


def weights(args: dict) -> dict:
  """Writes a random Qwen3 checkpoint (fixed seed) once, as safetensors."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  out = pathlib.Path(args["ckpt"])
  cfg = transformers.Qwen3Config(**args["hf_config"])
  if (out / "config.json").is_file():
    stored = json.loads((out / "config.json").read_text())
    if all(stored.get(k) == v for k, v in args["hf_config"].items()):
      return {"ckpt": str(out), "written": False}
  torch.manual_seed(args["seed"])
  model = transformers.Qwen3ForCausalLM(cfg)
  tmp = out.with_name(out.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  model.save_pretrained(tmp)  # safetensors
  shutil.rmtree(out, ignore_errors=True)
  os.replace(tmp, out)  # readers see a whole checkpoint or none
  n = sum(p.numel() for p in model.parameters())
  return {"ckpt": str(out), "written": True, "num_params": n}


_KINDS = {
    "weights": weights,
    "roofline": roofline,
    "sat": sat,
    "torch": torch_side,
    "memory": memory,
}


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("kind", choices=sorted(_KINDS))
  parser.add_argument("--args", default="{}", help="JSON object")
  parser.add_argument("--out", required=True, type=pathlib.Path)
  ns = parser.parse_args()
  result = _KINDS[ns.kind](json.loads(ns.args))
  ns.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main()
