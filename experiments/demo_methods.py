"""The demo with SAT, `joint` and `single` side by side, from one base.

  .venv/bin/python experiments/demo_methods.py            # all three
  .venv/bin/python experiments/demo_methods.py --methods sat --stages 4

Runs `sat-jax train --config experiments/demo.py` once per method in
runs/demo_methods/<method> (extra `--config.*` overrides after `--` go to
every run). The first run builds the warm-start base and the others start
from that same base (their team entries point at it), or all start from
`--base DIR` (e.g. runs/demo/pretrain/base of the main job), so the runs
differ only in the method. With `--stages N` each run does exactly N
stages (no time budget), so the curves compare stage by stage. `single`
trains the last speaker (agent n-1), whose message is the relay team's
answer. Writes results/demo_methods.json and
.md: held-out team accuracy per stage for each method, wall times, and the
machine's load average before and after each run (the machine may be
shared; rerun on a quiet one for timings). `--existing sat=runs/demo`
reports a finished run (here the main job itself) beside the new ones; its
wall time is its summary's (which includes the warm start it built).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

_REPO = pathlib.Path(__file__).resolve().parent.parent


def _run(method: str, workdir: pathlib.Path, base: pathlib.Path | None, args):
  cmd = [
      sys.executable,
      "-m",
      "sat_jax.main",
      "train",
      f"--config={_REPO / 'experiments' / 'demo.py'}:method={method}",
      f"--workdir={workdir}",
      *args.overrides,
  ]
  if args.stages:
    cmd += [f"--config.num_stages={args.stages}", "--config.time_budget_s=0"]
  if method == "single":
    cmd.append(f"--config.sat.single_agent={args.num_agents - 1}")
  if base is not None:
    cmd += [f"--config.team[{j}].model={base}" for j in range(args.num_agents)]
  load_before = os.getloadavg()
  start = time.time()
  subprocess.run(cmd, check=True, cwd=_REPO)
  wall = time.time() - start
  summary = json.loads((workdir / "summary.json").read_text())
  return {
      "method": method,
      "wall_s": round(wall, 1),
      "load_before": [round(x, 2) for x in load_before],
      "load_after": [round(x, 2) for x in os.getloadavg()],
      "summary": summary,
  }


def _finished(method: str, workdir: pathlib.Path):
  """An already finished run (e.g. the main job's) as a result row."""
  path = workdir / "summary.json"
  if not path.is_file():
    raise FileNotFoundError(f"--existing {method}={workdir}: no {path}")
  summary = json.loads(path.read_text())
  return {
      "method": method,
      "wall_s": summary["time_wall_s"],
      "load_before": None,  # not measured by this script
      "load_after": None,
      "summary": summary,
  }


def _markdown(results) -> str:
  steps = sorted({int(s) for r in results for s in r["summary"]["accuracy"]})
  key = results[0]["summary"]["accuracy_key"]
  head = " | ".join(r["method"] for r in results)
  lines = [
      f"Held-out team {key} (relay team of 3, same base) per stage:",
      "",
      f"| stage | {head} |",
      "| ---: |" + " ---: |" * len(results),
  ]
  for s in steps:
    cells = [
        f"{r['summary']['accuracy'].get(str(s), float('nan')):.3f}"
        for r in results
    ]
    lines.append(f"| {s} | " + " | ".join(cells) + " |")
  lines += [
      "",
      (
          "Gain: last eval minus the eval before training. Last 10: the mean of"
          " the last 10 evals (one eval of 200 problems x 2 samples has a"
          " standard error of about 2 points)."
      ),
      "",
      (
          "| method | stages | gain (points) | last 10 | inside trust region |"
          " wall s | load |"
      ),
  ]
  lines.append("| --- | ---: | ---: | ---: | --- | ---: | --- |")
  for r in results:
    s = r["summary"]
    load = "n/a"
    if r["load_before"] is not None:
      load = f"{r['load_before'][0]} -> {r['load_after'][0]}"
    curve = [
        v for _, v in sorted((int(k), v) for k, v in s["accuracy"].items())
    ]
    last = sum(curve[-10:]) / len(curve[-10:])
    lines.append(
        f"| {r['method']} | {s['stages_completed']} | {s.get('gain_points')} |"
        f" {last:.3f} | {s['all_accepted_inside_trust_region']} |"
        f" {r['wall_s']} | {load} |"
    )
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--methods", default="sat,joint,single")
  parser.add_argument("--stages", type=int, default=0, help="0: the demo's")
  parser.add_argument("--num_agents", type=int, default=3)
  parser.add_argument("--base", default=None, help="existing base folder")
  parser.add_argument(
      "--existing",
      action="append",
      default=[],
      help="METHOD=WORKDIR: report a finished run instead of running it",
  )
  parser.add_argument("--root", default=str(_REPO / "runs" / "demo_methods"))
  parser.add_argument("--out", default=str(_REPO / "results" / "demo_methods"))
  parser.add_argument("overrides", nargs="*", help="--config.* flags")
  args = parser.parse_args()
  root = pathlib.Path(args.root)
  results = []
  base = pathlib.Path(args.base).absolute() if args.base else None
  for spec in args.existing:
    method, _, workdir = spec.partition("=")
    results.append(_finished(method, pathlib.Path(workdir)))
  for method in args.methods.split(","):
    results.append(_run(method, root / method, base, args))
    if base is None:
      base = root / method / "pretrain" / "base"
  sys.path.insert(0, str(_REPO))
  from sat_jax import io_utils  # pylint: disable=g-import-not-at-top

  out = pathlib.Path(args.out)
  io_utils.atomic_write_json(out.with_suffix(".json"), results)
  io_utils.atomic_write_text(out.with_suffix(".md"), _markdown(results))
  sys.stdout.write(_markdown(results))


if __name__ == "__main__":
  main()
