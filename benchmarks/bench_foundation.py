"""Foundation benchmark: sat_jax sampler and scoring vs transformers and Tunix.

    .venv/bin/python benchmarks/bench_foundation.py [--quick] [--parts ...]
        [--update_md]

Workloads (Qwen3 architecture, random weights from a fixed seed, written once
as safetensors under --out_dir and read by every side):
- sampler: batch 32, prompt 64 random ids, exactly 64 new tokens (no stop
  token), temperature 1, top_k off, top_p 1. sat_jax `sampling.sample`,
  transformers `generate` (torch CPU, 2 threads, use_cache, do_sample) and
  Tunix's KV-cache `Sampler` (in .venv-tunix, benchmarks/setup_tunix_venv.sh).
- scoring: teacher-forced log-probs of 32 x 128 sequences; sat_jax
  `scoring.token_logprobs` vs torch forward + log_softmax + gather.
- roofline: a jitted 2048x2048 f32 matmul in the same run; each side's model
  FLOP/s is reported as a fraction of it (FLOP formula: `model_flops`). The
  same matmul with bfloat16 operands (float32 accumulation) gives the note
  under the table: what the bfloat16 rows' targets need of that rate.
- memory: peak memory of one jitted log-prob + KL call at B=4, T=2048,
  V=151936 on the bench-tiny body, chunked vs naive (fresh process each).

Each measurement runs in its own process (benchmarks/foundation_workers.py):
one warm-up call (compile), then the median of --repeats timed calls.
Results: --out_dir/results.json and results.md; --update_md also rewrites the
"Foundation" section of BENCHMARKS.md.
"""

import argparse
import json
import os
import pathlib
import shlex
import subprocess
import sys
import time

import numpy as np

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parent
DEFAULT_OUT_DIR = _REPO / "bench_out/foundation"
sys.path.insert(0, str(_REPO))

from sat_jax import host_memory  # pylint: disable=g-import-not-at-top
from sat_jax import io_utils  # pylint: disable=g-import-not-at-top
import host_info  # pylint: disable=g-import-not-at-top

# The two shapes; rope_theta 1e6 because tunix 0.1.7 hard-codes it.
BENCH_CONFIGS = {
    "bench-tiny": dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=4,
                       head_dim=32, intermediate_size=768),
    "bench-small": dict(vocab_size=32000, hidden_size=512, num_hidden_layers=8,
                        num_attention_heads=8, num_key_value_heads=4,
                        head_dim=64, intermediate_size=1536),
}  # fmt: skip
_COMMON_HF = dict(
    tie_word_embeddings=True,
    max_position_embeddings=2048,
    rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
)
WORKLOAD = dict(batch=32, prompt_len=64, new_tokens=64, seed=0)
TARGETS = {"bench-tiny": 5.0, "bench-small": 3.0}  # sampler x transformers
PARTS = ("roofline", "sampler", "tunix", "memory")


def model_flops(hf: dict, positions: int, head_positions: int, ctx_sum: int):
  """Useful forward FLOPs: 2 N_body x positions + 2 D V x head positions

  + 4 L H Hd x ctx_sum, where N_body = L (D H Hd + 2 D K Hd + H Hd D + 3 D F)
  is the non-embedding matmul parameter count (norms ignored), `positions`
  the tokens run through the body, `head_positions` those whose logits are
  needed, and `ctx_sum` the number of (query, causal key) pairs (QK^T and
  AV, 2 FLOPs per multiply-add each). Padding or cache slots a side computes
  beyond that are not counted.
  """
  d, f, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
  layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
  kv, hd = hf["num_key_value_heads"], hf["head_dim"]
  n_body = layers * (2 * d * heads * hd + 2 * d * kv * hd + 3 * d * f)
  return (
      2 * n_body * positions
      + 2 * d * v * head_positions
      + 4 * layers * heads * hd * ctx_sum
  )


def sampler_flops(hf: dict, b: int, p: int, n: int) -> int:
  # Prefill runs P positions and needs logits at the last one; decode runs
  # the N - 1 new tokens that are fed back. Position i attends to i + 1 keys.
  positions = p + n - 1
  ctx_sum = sum(i + 1 for i in range(positions))
  return b * model_flops(hf, positions, n, ctx_sum)


def scoring_flops(hf: dict, b: int, t: int) -> int:
  return b * model_flops(hf, t, t, sum(i + 1 for i in range(t)))


def _worker(kind, args, out_dir, python=None, script=None, timeout=3600):
  """Runs one measurement in a fresh process; returns its JSON (or error)."""
  out = out_dir / "raw" / f"{kind}-{int(time.time() * 1e3)}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=str(_REPO), TOKENIZERS_PARALLELISM="false")
  env.setdefault("HF_HUB_OFFLINE", "1")
  env.setdefault("TRANSFORMERS_OFFLINE", "1")
  # Every side, Tunix's venv too, in the malloc setting of the `sat-jax`
  # command (sat_jax.host_memory); glibc reads these at process start. Not
  # the memory part: its RSS would include pages freed before the measured
  # call (the params' init).
  reuse = kind != "memory" and env.get(host_memory.ENV_VAR) != "system"
  if reuse:
    env.update(host_memory.glibc_environment())
  if script is None:
    cmd = [python or sys.executable, str(_HERE / "foundation_workers.py"), kind]
    cmd += ["--args", json.dumps(args), "--out", str(out)]
  else:
    cmd = [python, str(script)] + args
  print("$", shlex.join(cmd), flush=True)
  t0 = time.perf_counter()
  try:
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout
    )
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    tail = (proc.stdout + proc.stderr)[-3000:]
    print(tail, file=sys.stderr)
    return {"error": f"exit {proc.returncode}: {tail[-600:]}"}
  if script is not None:
    result = json.loads(proc.stdout.strip().splitlines()[-1])
  else:
    result = json.loads(out.read_text())
  result["process_wall_s"] = wall
  result["malloc_reused"] = reuse
  print("  ->", json.dumps(_summary(result))[:300], flush=True)
  return result


def _summary(result):
  keep = ("median_s", "flop_per_s", "peak_rss_bytes", "ran", "error")
  out = {}
  for k, v in result.items():
    if k in keep:
      out[k] = v
    elif isinstance(v, dict) and "median_s" in v:
      out[k] = v["median_s"]
  return out


def _hf_config(name):
  return dict(BENCH_CONFIGS[name], **_COMMON_HF)


def run_roofline(ns, out_dir):
  return _worker("roofline", {"repeats": 5 if ns.quick else 20}, out_dir)


def run_sampler(ns, out_dir, name, dtype, ckpt):
  hf = _hf_config(name)
  args = dict(WORKLOAD, vocab=hf["vocab_size"], ckpt=str(ckpt), dtype=dtype,
              repeats=ns.repeats, threads=ns.threads,
              chunk_size=ns.chunk_size)  # fmt: skip
  res = {}
  for side, kind in (("sat_jax", "sat"), ("transformers", "torch")):
    logp_path = out_dir / "raw" / f"logp-{name}-{dtype}-{side}.npy"
    extra = {"sampler_devices": ns.sampler_devices} if kind == "sat" else {}
    res[side] = _worker(
        kind, dict(args, logp_out=str(logp_path), **extra), out_dir
    )
    res[side]["logp_path"] = str(logp_path)
  paths = [res[s]["logp_path"] for s in ("sat_jax", "transformers")]
  if all(pathlib.Path(p).is_file() for p in paths):
    a, b = (np.load(p) for p in paths)
    res["scoring_max_abs_diff"] = float(np.abs(a - b).max())
  return res


def run_tunix(ns, out_dir, name, dtype, ckpt):
  python = pathlib.Path(ns.tunix_python)
  if not python.is_file():
    return {"error": f"{python} not found: run benchmarks/setup_tunix_venv.sh"}
  args = ["--ckpt", str(ckpt), "--dtype", dtype, "--repeats", str(ns.repeats)]
  for k in ("batch", "prompt_len", "new_tokens", "seed"):
    args += [f"--{k}", str(WORKLOAD[k])]
  return _worker(
      "tunix", args, out_dir, str(python), _HERE / "bench_tunix_worker.py"
  )


def run_memory(ns, out_dir):
  tiny = BENCH_CONFIGS["bench-tiny"]
  model = dict(family="qwen3", vocab_size=151936,
               hidden_size=tiny["hidden_size"],
               num_layers=tiny["num_hidden_layers"],
               num_heads=tiny["num_attention_heads"],
               num_kv_heads=tiny["num_key_value_heads"],
               head_dim=tiny["head_dim"], mlp_dim=tiny["intermediate_size"],
               tie_embeddings=True, max_seq_len=2048)  # fmt: skip
  rows = []
  for variant in ("chunked", "naive"):
    for grad in (False, True):
      limit = ns.memory_run_limit_gib
      args = dict(model=model, batch=4, length=2048, variant=variant,
                  grad=grad, chunk_size=ns.chunk_size,
                  run_limit_bytes=limit and int(limit * 2**30))  # fmt: skip
      rows.append(_worker("memory", args, out_dir))
  return rows


def _rate(n, res, part):
  try:
    return n / res[part]["median_s"]
  except (KeyError, TypeError):
    return None


def _dtype_peak(results, dtype):
  """The roofline FLOP/s of a matmul in `dtype` (float32 or bfloat16)."""
  roof = results.get("roofline") or {}
  if dtype == "float32":
    return roof.get("flop_per_s")
  return (roof.get(dtype) or {}).get("flop_per_s")


def derive(results):
  """Adds tokens/s, ratios and roofline fractions to the raw results."""
  peak = _dtype_peak(results, "float32")
  b, p, n = (WORKLOAD[k] for k in ("batch", "prompt_len", "new_tokens"))
  for name, per_dtype in results.get("runs", {}).items():
    hf = _hf_config(name)
    f_sample = sampler_flops(hf, b, p, n)
    f_score = scoring_flops(hf, b, p + n)
    for dtype, row in per_dtype.items():
      d = {}
      for side in ("sat_jax", "transformers"):
        r = row.get(side, {})
        d[f"{side}_sampler_tok_s"] = _rate(b * n, r, "sampler")
        d[f"{side}_scoring_tok_s"] = _rate(b * (p + n), r, "scoring")
        for part, flops in (("sampler", f_sample), ("scoring", f_score)):
          rate = _rate(flops, r, part)
          d[f"{side}_{part}_flop_s"] = rate
          d[f"{side}_{part}_roofline"] = rate / peak if rate and peak else None
      sat = row.get("sat_jax", {})
      d["sat_jax_multi_sampler_tok_s"] = _rate(b * n, sat, "sampler_multi")
      d["sat_jax_multi_same_tokens"] = sat.get("sampler_same_tokens")
      tx = row.get("tunix", {})
      for mode in ("core", "call"):
        t = tx.get(f"{mode}_median_s")
        d[f"tunix_{mode}_tok_s"] = b * n / t if t else None
      for a, c, key in (
          (
              "sat_jax_sampler_tok_s",
              "transformers_sampler_tok_s",
              "sampler_x_hf",
          ),
          (
              "sat_jax_scoring_tok_s",
              "transformers_scoring_tok_s",
              "scoring_x_hf",
          ),
          ("sat_jax_sampler_tok_s", "tunix_core_tok_s", "sampler_x_tunix"),
          (
              "sat_jax_multi_sampler_tok_s",
              "transformers_sampler_tok_s",
              "sampler_multi_x_hf",
          ),
      ):
        d[key] = d[a] / d[c] if d[a] and d[c] else None
      d["sampler_target_x_hf"] = TARGETS[name]
      # The target is a multiple of transformers' rate on the same FLOPs, so
      # it asks for that multiple of transformers' fraction of the roofline:
      # above 1, no sampler of this FLOP count reaches it on this host.
      hf_roof = d["transformers_sampler_roofline"]
      d["sampler_target_roofline"] = (
          TARGETS[name] * hf_roof if hf_roof else None
      )
      # The same against the matmul of the row's own dtype (bfloat16 runs
      # at about twice the float32 rate on CPUs with AVX512-BF16, and at
      # about 0.6x on CPUs without bfloat16 arithmetic).
      own_peak = _dtype_peak(results, dtype)
      hf_rate = d["transformers_sampler_flop_s"]
      d["sampler_target_dtype_roofline"] = (
          TARGETS[name] * hf_rate / own_peak if hf_rate and own_peak else None
      )
      row["derived"] = d
  return results


def _fmt(x, spec=",.0f"):
  return "n/a" if x is None else format(x, spec)


def _gib(x):
  return "n/a" if x is None else f"{x / 2**30:.2f}"


def _same_tokens(results) -> str:
  flags = [
      row.get("derived", {}).get("sat_jax_multi_same_tokens")
      for per_dtype in results.get("runs", {}).values()
      for row in per_dtype.values()
  ]
  flags = [f for f in flags if f is not None]
  return ("yes" if all(flags) else "NO") if flags else "n/a"


def _bfloat16_roofline_lines(results, peak, pct) -> list[str]:
  """A note under the table: the bfloat16 rows against a bfloat16 matmul."""
  peak16 = _dtype_peak(results, "bfloat16")
  needs = [
      f"{name} {pct(row['derived'].get('sampler_target_dtype_roofline'))}%"
      for name, per_dtype in results.get("runs", {}).items()
      for dtype, row in per_dtype.items()
      if dtype == "bfloat16" and "derived" in row
  ]
  if not (peak16 and needs):
    return []
  ratio = f" ({peak16 / peak:.2f}x float32)" if peak else ""
  return [
      "",
      (
          "bfloat16 roofline (jitted 2048x2048 matmul, bfloat16 operands,"
          f" float32 accumulation): {peak16 / 1e9:.0f} GFLOP/s{ratio}."
          " Against it the bfloat16 rows' sampler targets need: "
          + ", ".join(needs)
          + "."
      ),
  ]


def markdown(results, command):
  """The results as markdown tables (the Foundation section body)."""
  peak = _dtype_peak(results, "float32")
  load = [results.get(k) for k in ("load_avg_start", "load_avg_end")]
  load_s = "" if None in load else (
      f" Load average (1 min) at start / end: {load[0]:.1f} / {load[1]:.1f}."
  )  # fmt: skip
  lines = [
      f"Command: `{command}`",
      "",
      (
          f"Run {results['date']} on {results['machine']}.{load_s} Roofline"
          " (jitted 2048x2048 f32 matmul, median):"
          f" {_fmt(peak and peak / 1e9, '.0f')} GFLOP/s. Sampler: batch 32,"
          " prompt 64, exactly 64 new tokens, temperature 1, no top-k/top-p;"
          " scoring: 32 x 128 teacher-forced. tok/s are medians of the timed"
          ' calls after one warm-up. "2 CPU devices": the same sampler call'
          " with its rows over two XLA CPU devices (`jax_num_cpu_devices=2`,"
          " params replicated: one 16-row decode stream per core), timed"
          " call by call alternately with the one-device call in one process;"
          " same tokens as one device for the same key:"
          f" {_same_tokens(results)}."
      ),
  ]
  if results.get("runs"):
    lines += [
        "",
        (
            "| config | dtype | sat_jax new tok/s | transformers | x (target) |"
            " sat_jax, 2 CPU devices: new tok/s (x) |"
            " Tunix core / call | x Tunix | sat_jax score tok/s | transformers"
            " | x (>= 1) | sampler % roofline (sat / hf / target needs) |"
            " scoring % roofline (sat / hf) |"
        ),
        (
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            " ---: | ---: | ---: | ---: |"
        ),
    ]

  def pct(x):
    return _fmt(x and 100 * x, ".1f")

  for name, per_dtype in results.get("runs", {}).items():
    for dtype, row in per_dtype.items():
      d = row.get("derived", {})
      lines.append(
          f"| {name} | {dtype} | {_fmt(d.get('sat_jax_sampler_tok_s'))} |"
          f" {_fmt(d.get('transformers_sampler_tok_s'))} |"
          f" {_fmt(d.get('sampler_x_hf'), '.2f')} ({TARGETS[name]:g}) |"
          f" {_fmt(d.get('sat_jax_multi_sampler_tok_s'))}"
          f" ({_fmt(d.get('sampler_multi_x_hf'), '.2f')}) |"
          f" {_fmt(d.get('tunix_core_tok_s'))} /"
          f" {_fmt(d.get('tunix_call_tok_s'))} |"
          f" {_fmt(d.get('sampler_x_tunix'), '.2f')} |"
          f" {_fmt(d.get('sat_jax_scoring_tok_s'))} |"
          f" {_fmt(d.get('transformers_scoring_tok_s'))} |"
          f" {_fmt(d.get('scoring_x_hf'), '.2f')} |"
          f" {pct(d.get('sat_jax_sampler_roofline'))} /"
          f" {pct(d.get('transformers_sampler_roofline'))} /"
          f" {pct(d.get('sampler_target_roofline'))} |"
          f" {pct(d.get('sat_jax_scoring_roofline'))} /"
          f" {pct(d.get('transformers_scoring_roofline'))} |"
      )
  lines += _bfloat16_roofline_lines(results, peak, pct)
  mem = results.get("memory")
  if mem:
    lines += [
        "",
        (
            "Memory: one jitted log-prob + KL call (`scoring.token_logprobs` +"
            " `scoring.state_kl`, chunk 128; or the gradient of their sum"
            " w.r.t. the new params, with layer remat) at B=4, T=2048,"
            " V=151936 on the bench-tiny body (tied), vs naive full [B, T, V]"
            " f32 logits (`models.forward` + log_softmax). One [B, T, V] f32"
            f" array is {_gib(mem[0].get('full_logits_bytes'))} GiB. Peak RSS:"
            " the process high-water mark over compile + run, reset after the"
            " two param sets were made (so it includes them, the XLA runtime"
            " and the model body's activations); base: RSS before compiling."
            " XLA: compiled temp + arguments + outputs (`memory_analysis()`)."
        ),
        "",
        (
            "| variant | pass | peak RSS GiB | base GiB | XLA estimate GiB |"
            " XLA temp GiB | ran |"
        ),
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in mem:
      xla = r.get("xla", {})
      if r.get("ran"):
        ran = "yes"
      elif "error" in r:
        ran = "error: " + r["error"][:60]
      else:
        ran = "no: 3.5x the XLA estimate exceeds free memory"
      lines.append(
          f"| {r.get('variant', '?')} | {'fwd+bwd' if r.get('grad') else 'fwd'}"
          f" | {_gib(r.get('peak_rss_bytes'))} |"
          f" {_gib(r.get('rss_base_bytes'))} |"
          f" {_gib(xla.get('total_bytes'))} | {_gib(xla.get('temp_bytes'))} |"
          f" {ran} |"
      )
  return "\n".join(lines) + "\n"


def update_benchmarks_md(body: str) -> None:
  """Replaces the "## Foundation" section of BENCHMARKS.md (re-read now)."""
  path = _REPO / "BENCHMARKS.md"
  text = path.read_text() if path.is_file() else "# Benchmarks\n"
  section = "## Foundation\n\n" + _SECTION_INTRO + "\n" + body
  lines = text.splitlines(keepends=True)
  start = next(
      (i for i, l in enumerate(lines) if l.strip() == "## Foundation"), None
  )
  if start is None:
    new = text.rstrip("\n") + "\n\n" + section
  else:
    end = next(
        (i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
        len(lines),
    )
    rest = "".join(lines[end:])
    new = "".join(lines[:start]) + section + ("\n" + rest if rest else "")
  io_utils.atomic_write_text(path, new)


_SECTION_INTRO = (
    "sat_jax's sampler and scoring against transformers' PyTorch `generate` /"
    " forward (CPU, 2 threads, use_cache, do_sample, top_k 0,"
    " `min_new_tokens = max_new_tokens = 64`) and Tunix 0.1.7's KV-cache"
    " `Sampler` on the same random Qwen3 weights (seed 0, written once as"
    " safetensors): `benchmarks/bench_foundation.py`, each measurement in a"
    " fresh process, every side (transformers and Tunix too) in the host"
    " malloc setting of the `sat-jax` command (`sat_jax.host_memory`: freed"
    " pages kept for reuse; `SAT_JAX_MALLOC=system` turns it off), except"
    " the memory part, which runs with glibc's defaults so that its peak RSS"
    " follows live memory (kept pages would add whatever the process freed"
    " before, such as the params' init). Tunix runs in `.venv-tunix` (made by"
    " `benchmarks/setup_tunix_venv.sh`) with top_p=1.0, top_k=None (a plain"
    " `jax.random.categorical` over the full vocabulary, i.e. the same"
    " workload); its decode loop runs one forward step more than it keeps."
    " Tunix core = its jitted prefill + decode on token ids; call ="
    " `Sampler.__call__` on id strings. Model FLOPs (useful work only, per"
    " row): 2 N_body (P + N - 1) + 2 D V N + 4 L H Hd sum(ctx) for the"
    " sampler and 2 N_body T + 2 D V T + 4 L H Hd sum(ctx) for scoring,"
    " N_body = L (2 D H Hd + 2 D K Hd + 3 D F), ctx = causal keys per query;"
    " % roofline = model FLOP/s over the matmul's FLOP/s; target needs ="
    " the sampler target x transformers' % roofline (the sampler % roofline"
    " that meets the target; over 100 in a float32 row: beyond the float32"
    " matmul's own rate on this host, a bound bfloat16 dots may pass)."
    " Targets: sampler"
    " >= 5x transformers on bench-tiny and >= 3x on bench-small, ahead of"
    " Tunix; scoring >= 1x; chunked log-prob + KL peak < 3 GiB. On the"
    " shared 2-core development machine the numbers swing by 2x or more"
    " with load (transformers' OpenMP threads suffer most); only a quiet"
    " machine gives final figures.\n"
)


def _parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out_dir", default=str(DEFAULT_OUT_DIR))
  parser.add_argument("--parts", default=",".join(PARTS))
  parser.add_argument("--configs", default=",".join(BENCH_CONFIGS))
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--quick", action="store_true", help="2 repeats")
  parser.add_argument("--threads", type=int, default=2, help="torch threads")
  parser.add_argument("--chunk_size", type=int, default=128)
  parser.add_argument(
      "--sampler_devices",
      type=int,
      default=2,
      help=(
          "sat_jax's sampler is also timed with its rows over this many XLA"
          " CPU devices (one decode stream per core), interleaved with the"
          " one-device calls; 1: not"
      ),
  )
  parser.add_argument(
      "--tunix_python", default=str(_REPO / ".venv-tunix/bin/python")
  )
  parser.add_argument(
      "--memory_run_limit_gib",
      type=float,
      default=None,
      help=(
          "run a memory variant only if 3.5x XLA's estimate is below this"
          " (default: free memory - 2 GiB)"
      ),
  )
  parser.add_argument("--update_md", action="store_true")
  parser.add_argument(
      "--render_only",
      action="store_true",
      help="re-render --out_dir/results.json without measuring",
  )
  ns = parser.parse_args()
  if ns.quick:
    ns.repeats = 2
  ns.parts = ns.parts.split(",")
  if set(ns.parts) - set(PARTS):
    parser.error(f"--parts: unknown {ns.parts}; known: {PARTS}")
  ns.configs = ns.configs.split(",")
  if set(ns.configs) - set(BENCH_CONFIGS):
    parser.error(f"--configs: known {list(BENCH_CONFIGS)}")
  ns.dtypes = ns.dtypes.split(",")
  if set(ns.dtypes) - {"float32", "bfloat16"}:
    parser.error("--dtypes: float32 and/or bfloat16")
  if ns.update_md and not ns.render_only and set(ns.parts) != set(PARTS):
    # The section is rendered from this run alone: a partial run would
    # drop the other parts' tables from BENCHMARKS.md.
    parser.error(
        "--update_md rewrites the whole Foundation section: run all"
        " --parts (a partial run writes results.md only)"
    )
  ns.out_dir = pathlib.Path(ns.out_dir)
  return ns


def run_all(ns, command: str) -> dict:
  """Every selected part, each measurement in its own process."""
  results = {
      "command": command,
      "date": time.strftime("%Y-%m-%d %H:%M"),
      "machine": host_info.describe(),
      "workload": WORKLOAD,
      "load_avg_start": os.getloadavg()[0],
      "runs": {},
  }
  if "roofline" in ns.parts:
    results["roofline"] = run_roofline(ns, ns.out_dir)
  for name in ns.configs if {"sampler", "tunix"} & set(ns.parts) else ():
    ckpt = ns.out_dir / name
    written = _worker(
        "weights",
        {"ckpt": str(ckpt), "hf_config": _hf_config(name), "seed": 0},
        ns.out_dir,
    )
    if "error" in written:
      raise SystemExit(f"could not write {ckpt}: {written['error']}")
    for dtype in ns.dtypes:
      row = results["runs"].setdefault(name, {}).setdefault(dtype, {})
      if "sampler" in ns.parts:
        row.update(run_sampler(ns, ns.out_dir, name, dtype, ckpt))
      if "tunix" in ns.parts:
        row["tunix"] = run_tunix(ns, ns.out_dir, name, dtype, ckpt)
  if "memory" in ns.parts:
    results["memory"] = run_memory(ns, ns.out_dir)
  results["load_avg_end"] = os.getloadavg()[0]
  return results


def main():
  ns = _parse_args()
  if ns.render_only:
    results = json.loads((ns.out_dir / "results.json").read_text())
    command = results["command"]
  else:
    command = shlex.join(
        [".venv/bin/python", "benchmarks/bench_foundation.py"] + sys.argv[1:]
    )
    results = run_all(ns, command)
  derive(results)
  io_utils.atomic_write_json(ns.out_dir / "results.json", results)
  body = markdown(results, command)
  io_utils.atomic_write_text(ns.out_dir / "results.md", body)
  print(body)
  if ns.update_md:
    update_benchmarks_md(body)


if __name__ == "__main__":
  main()
