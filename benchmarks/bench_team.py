"""LM-team benchmark: GRPO step vs TRL, the demo's stages, scaling in n.

    .venv/bin/python benchmarks/bench_team.py [--quick] [--parts grpo,demo,scaling]
        [--update_md] [--render_only]

Parts (each measurement in a fresh process, benchmarks/team_workers.py):
- grpo: one sat_jax `single`-mode GRPO step (a `run_stage` on a 1-agent
  team; team rollout and direct sampler rollout) against TRL 1.16's
  `GRPOTrainer` on the same bench-tiny weights and tokenizer
  (team_assets.py): 8 prompts x 4 generations, exactly 64 new tokens,
  AdamW, no reference KL, float32, 2 threads (team_grpo.py has the exact
  settings). Median seconds per optimizer step, steps 2 onward; `--rounds`
  alternates the two sides so that both see the same machine load.
- demo: `experiments/demo.py` run by `sat_jax.train.train_and_evaluate`, each
  stage's wall time split into rollout, update, backtracks, scoring, other,
  plus the held-out eval and the whole stage period; episodes per second.
- scaling: the demo with n = 1, 2, 3, 4, 6 agents, `reuse` and `resample`:
  seconds per stage (median after warm-up), rollouts per stage, and a
  least-squares line per mode (slope, intercept, R^2).
Results: <out_dir>/results.json and results.md; --update_md rewrites the
"LM teams" section of BENCHMARKS.md (re-read just before writing).
"""

import argparse
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

_HERE = pathlib.Path(__file__).resolve().parent
_REPO = _HERE.parent
sys.path.insert(0, str(_REPO))
sys.path.insert(0, str(_HERE))

from sat_jax import io_utils  # pylint: disable=g-import-not-at-top,wrong-import-position
from bench_foundation import DEFAULT_OUT_DIR as FOUNDATION_OUT_DIR, sampler_flops  # pylint: disable=g-import-not-at-top,wrong-import-position
import host_info  # pylint: disable=g-import-not-at-top,wrong-import-position
import team_grpo  # pylint: disable=g-import-not-at-top,wrong-import-position
import team_report  # pylint: disable=g-import-not-at-top,wrong-import-position

PARTS = ("grpo", "demo", "scaling")
SECTION = "## LM teams"


def _wait_for_quiet(ns) -> float:
  """Waits until the 1-min load average < --max_load (or the wait ends)."""
  deadline = time.time() + ns.load_wait_s
  while ns.max_load and os.getloadavg()[0] >= ns.max_load:
    if time.time() > deadline:
      print(f"  load still {os.getloadavg()[0]:.1f}; measuring anyway")
      break
    time.sleep(10)
  return os.getloadavg()[0]


def _worker(ns, kind: str, args: dict, timeout: int) -> dict:
  """Runs one team_workers.py measurement; its JSON, or {"error": ...}."""
  load_start = _wait_for_quiet(ns)
  out = ns.out_dir / "raw" / f"{kind}-{int(time.time() * 1e3)}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=str(_REPO), TOKENIZERS_PARALLELISM="false")
  env.setdefault("HF_HUB_OFFLINE", "1")
  env.setdefault("TRANSFORMERS_OFFLINE", "1")
  cmd = [sys.executable, str(_HERE / "team_workers.py"), kind]
  cmd += ["--args", json.dumps(args), "--out", str(out)]
  print("$", shlex.join(cmd), flush=True)
  log = out.with_suffix(".log")  # the worker's output, progress bars too
  t0 = time.perf_counter()
  try:
    with open(log, "w") as f:
      proc = subprocess.run(
          cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
      )
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s (log: {log})"}
  if proc.returncode != 0:
    tail = log.read_text(errors="replace")[-3000:]
    print(tail, file=sys.stderr)
    return {"error": f"exit {proc.returncode} (log: {log}): {tail[-600:]}"}
  result = json.loads(out.read_text())
  result["process_wall_s"] = time.perf_counter() - t0
  result["load_avg"] = [load_start, os.getloadavg()[0]]
  print(f"  -> {kind} done in {result['process_wall_s']:.0f} s", flush=True)
  return result


def run_grpo(ns) -> dict:
  """Builds the bench model, then alternates sat_jax and TRL `ns.rounds` x."""
  assets = _worker(
      ns,
      "assets",
      {"out_dir": str(ns.out_dir), "foundation_dir": ns.foundation_dir},
      900,
  )
  if "error" in assets:
    raise SystemExit(f"could not build the bench model: {assets['error']}")
  common = dict(ckpt=assets["ckpt"], steps=ns.grpo_steps, cpus=ns.cpus)
  # The matmul's FLOP/s before and after the rounds says how fast the host
  # ran: its hardware changes between sessions, and the ratio with it.
  roofline = [_worker(ns, "roofline", {"cpus": ns.cpus}, 600)]
  rounds = []
  for r in range(ns.rounds):
    sides = {
        "sat_jax": (
            "sat_grpo",
            dict(
                common,
                paths=list(team_report.SAT_PATHS),
                seed=r,
                repeats=ns.repeats,
            ),
        ),
        "trl": ("trl_grpo", dict(common, threads=ns.threads, seed=r)),
    }
    # Odd rounds run TRL first, so that a load trend does not favour a side.
    order = ("sat_jax", "trl") if r % 2 == 0 else ("trl", "sat_jax")
    rounds.append(
        {side: _worker(ns, *sides[side], ns.timeout) for side in order}
    )
  roofline.append(_worker(ns, "roofline", {"cpus": ns.cpus}, 600))
  return {"assets": assets, "rounds": rounds, "roofline": roofline}


def run_demo(ns) -> dict:
  args = dict(
      part="demo",
      out_dir=str(ns.out_dir),
      stages=ns.demo_stages,
      demo_base=ns.demo_base,
      cpus=ns.cpus,
  )
  return _worker(ns, "stages", args, ns.timeout * 3)


def run_scaling(ns) -> dict:
  args = dict(
      part="scaling",
      out_dir=str(ns.out_dir),
      agents=ns.agents,
      modes=["reuse", "resample"],
      warmup=ns.warmup,
      stages=ns.scaling_stages,
      demo_base=ns.demo_base,
      cpus=ns.cpus,
  )
  return _worker(ns, "stages", args, ns.timeout * 6)


def linear_fit(x, y) -> dict:
  """Least-squares y = slope x + intercept, with R^2."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  slope, intercept = np.polyfit(x, y, 1)
  residual = y - (slope * x + intercept)
  total = np.sum((y - y.mean()) ** 2)
  r2 = 1.0 - np.sum(residual**2) / total if total > 0 else 1.0
  return {"slope": float(slope), "intercept": float(intercept), "r2": r2}


def grpo_step_flops(hf: dict, prompt_lengths, new_tokens: int) -> dict:
  """Useful FLOPs of one GRPO step, the same work on either side.

  Rollout and the update's forward both run P + N - 1 positions of a row
  through the body (the last new token is never fed back), the head at its
  N completion positions, and causal attention over them; the backward costs
  twice the forward (input and weight gradients; the first layer's input
  gradient feeds the tied embedding's). So a step is four forwards.
  """
  forward = sum(sampler_flops(hf, 1, p, new_tokens) for p in prompt_lengths)
  return {"rollout": forward, "update": 3 * forward, "step": 4 * forward}


def step_bound(grpo: dict) -> dict | None:
  """The step at the matmul roofline: the most any side could reach here."""
  peaks = [r.get("flop_per_s") for r in grpo.get("roofline", [])]
  peaks = [x for x in peaks if x]
  hf = grpo.get("assets", {}).get("hf_config")
  prompt_lengths = next(
      (
          rows
          for r in grpo.get("rounds", [])
          for path in team_report.SAT_PATHS
          if (rows := r["sat_jax"].get(path, {}).get("prompt_tokens_per_row"))
      ),
      None,
  )
  trl_s = grpo.get("pooled_median_s", {}).get("trl")
  if not (peaks and hf and prompt_lengths and trl_s):
    return None
  flops = grpo_step_flops(hf, prompt_lengths, team_grpo.NEW_TOKENS)
  # The faster roofline reading gives the smaller floor, i.e. the kinder bound.
  floor_s = flops["step"] / max(peaks)
  bound = dict(flops, peak_flop_per_s=max(peaks), floor_s=floor_s)
  bound["max_x_trl"] = trl_s / floor_s
  bound["target_roofline"] = team_report.TARGET_X * floor_s / trl_s
  for side, t in grpo["pooled_median_s"].items():
    bound[f"{side}_roofline"] = floor_s / t if t else None
  return bound


def derive(results: dict) -> dict:
  """Adds the step ratios and the scaling fits to the raw results."""
  grpo = results.get("grpo")
  if grpo:
    pooled = {"trl": []}
    for rnd in grpo["rounds"]:
      trl = rnd["trl"].get("times_s", [])[1:]
      pooled["trl"] += trl
      for path in team_report.SAT_PATHS:
        sat = rnd["sat_jax"].get(path, {}).get("times_s", [])[1:]
        pooled.setdefault(path, []).extend(sat)
        if sat and trl:
          rnd[f"x_{path}"] = statistics.median(trl) / statistics.median(sat)
    med = {k: statistics.median(v) if v else None for k, v in pooled.items()}
    grpo["pooled_median_s"] = med
    for path in team_report.SAT_PATHS:
      ok = med.get(path) and med["trl"]
      grpo[f"x_{path}"] = med["trl"] / med[path] if ok else None
    grpo["target_x"] = team_report.TARGET_X
    grpo["step_bound"] = step_bound(grpo)
  rows = (results.get("scaling") or {}).get("rows", [])
  fits = {}
  for mode in sorted({r["mode"] for r in rows}):
    sel = [r for r in rows if r["mode"] == mode]
    if len(sel) >= 2:
      n = [r["agents"] for r in sel]
      fits[mode] = {
          key: linear_fit(n, [r[f"{key}_s"] for r in sel])
          for key in ("stage", "no_backtracks")
      }
      # In a relay, agent j's view holds the j messages before its own, so
      # the work of a stage grows with the summed view length, not with n.
      if all(r.get("view_lengths") for r in sel):
        fits[mode]["no_backtracks_vs_sum_T"] = linear_fit(
            [sum(r["view_lengths"]) for r in sel],
            [r["no_backtracks_s"] for r in sel],
        )
  if rows:
    results["scaling"]["fits"] = fits
  return results


def update_benchmarks_md(body: str) -> None:
  """Replaces the "## LM teams" section of BENCHMARKS.md (read right now)."""
  path = _REPO / "BENCHMARKS.md"
  text = path.read_text() if path.is_file() else "# Benchmarks\n"
  lines = text.splitlines(keepends=True)
  start = next((i for i, l in enumerate(lines) if l.strip() == SECTION), None)
  section = SECTION + "\n\n" + body
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


def _parse_args():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out_dir", default=str(_REPO / "bench_out/team"))
  parser.add_argument(
      "--foundation_dir",
      default=str(FOUNDATION_OUT_DIR),
      help="bench_foundation.py's out_dir, to check the weights are the same",
  )
  parser.add_argument("--parts", default=",".join(PARTS))
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--rounds", type=int, default=2, help="grpo: sat, trl")
  parser.add_argument("--grpo_steps", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--demo_stages", type=int, default=6)
  parser.add_argument("--demo_base", default=None, help="existing base dir")
  parser.add_argument("--agents", default="1,2,3,4,6")
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--scaling_stages", type=int, default=3)
  parser.add_argument("--threads", type=int, default=2, help="torch threads")
  parser.add_argument("--cpus", type=int, default=2, help="CPUs per worker")
  parser.add_argument("--timeout", type=int, default=3600)
  parser.add_argument(
      "--max_load",
      type=float,
      default=None,
      help="wait before each measurement until the 1-min load is below this",
  )
  parser.add_argument("--load_wait_s", type=int, default=900)
  parser.add_argument("--update_md", action="store_true")
  parser.add_argument("--render_only", action="store_true")
  ns = parser.parse_args()
  if ns.quick:
    ns.rounds, ns.grpo_steps, ns.repeats = 1, 6, 3
    ns.demo_stages, ns.warmup, ns.scaling_stages = 4, 1, 2
  ns.parts = ns.parts.split(",")
  if set(ns.parts) - set(PARTS):
    parser.error(f"--parts: unknown in {ns.parts}; known: {PARTS}")
  ns.agents = [int(a) for a in ns.agents.split(",")]
  if ns.grpo_steps < 6:
    parser.error("--grpo_steps must be >= 6 (at least 5 steps after step 1)")
  if ns.demo_base and not pathlib.Path(ns.demo_base).is_dir():
    parser.error(f"--demo_base {ns.demo_base}: not a directory")
  ns.out_dir = pathlib.Path(ns.out_dir).absolute()
  ns.foundation_dir = str(pathlib.Path(ns.foundation_dir).absolute())
  return ns


def main():
  ns = _parse_args()
  path = ns.out_dir / "results.json"
  # Parts run now replace their entries; the others are kept, so that one
  # part can be rerun alone.
  results = json.loads(path.read_text()) if path.is_file() else {}
  if not ns.render_only:
    command = shlex.join(
        [".venv/bin/python", "benchmarks/bench_team.py"] + sys.argv[1:]
    )
    runners = {"grpo": run_grpo, "demo": run_demo, "scaling": run_scaling}
    for part in ns.parts:
      meta = {
          "command": command,
          "date": time.strftime("%Y-%m-%d %H:%M"),
          "machine": host_info.describe(),
          "load_avg_start": os.getloadavg()[0],
      }
      results[part] = runners[part](ns)
      results[part]["meta"] = dict(meta, load_avg_end=os.getloadavg()[0])
      derive(results)
      io_utils.atomic_write_json(path, results)
  derive(results)
  io_utils.atomic_write_json(path, results)
  body = team_report.markdown(results)
  io_utils.atomic_write_text(ns.out_dir / "results.md", body)
  print(body)
  if ns.update_md:
    update_benchmarks_md(body)


if __name__ == "__main__":
  main()
