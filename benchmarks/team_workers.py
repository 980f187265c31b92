"""Measurement workers of bench_team.py, one fresh process per call.

    python benchmarks/team_workers.py KIND --args JSON --out FILE

KIND: `assets` (write bench-tiny weights + tokenizer), `sat_grpo` / `trl_grpo`
(team_grpo.py), `stages` (team_stages.py: the demo breakdown and the
scaling in n), `roofline` (foundation_workers.py's jitted 2048x2048 float32
matmul). The process is pinned to `args["cpus"]` CPUs (if given) before
JAX or torch start, so that both sides get the same cores and XLA sizes
its thread pool to them; a fresh process per side keeps torch's spinning
OpenMP threads away from XLA's.
"""

import argparse
import json
import os
import pathlib
import sys

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(0, str(_HERE))

from sat_jax import host_memory  # pylint: disable=g-import-not-at-top


def _pin(cpus: int | None) -> list[int]:
  allowed = sorted(os.sched_getaffinity(0))
  if cpus and cpus < len(allowed):
    os.sched_setaffinity(0, allowed[:cpus])
  return sorted(os.sched_getaffinity(0))


def _assets(args):
  import team_assets  # pylint: disable=g-import-not-at-top

  return team_assets.prepare(
      pathlib.Path(args["out_dir"]), pathlib.Path(args["foundation_dir"])
  )


def _sat_grpo(args):
  import team_grpo  # pylint: disable=g-import-not-at-top

  return team_grpo.sat_grpo(args)


def _trl_grpo(args):
  import team_grpo  # pylint: disable=g-import-not-at-top

  return team_grpo.trl_grpo(args)


def _roofline(args):
  import foundation_workers  # pylint: disable=g-import-not-at-top

  return foundation_workers.roofline(args)


def _stages(args):
  import team_stages  # pylint: disable=g-import-not-at-top

  return team_stages.run(args)


_KINDS = {
    "assets": _assets,
    "sat_grpo": _sat_grpo,
    "trl_grpo": _trl_grpo,
    "stages": _stages,
    "roofline": _roofline,
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("kind", choices=sorted(_KINDS))
  parser.add_argument("--args", default="{}", help="JSON object")
  parser.add_argument("--out", required=True, type=pathlib.Path)
  ns = parser.parse_args()
  args = json.loads(ns.args)
  cpus = _pin(args.get("cpus"))
  # Every side (sat_jax, TRL) in the same host-malloc setting, before JAX or
  # torch starts a thread; $SAT_JAX_MALLOC=system keeps glibc's defaults.
  malloc_reused = host_memory.reuse_freed_pages()
  result = _KINDS[ns.kind](args)
  result["malloc_reused"] = malloc_reused
  result["cpus"] = cpus
  tmp = ns.out.with_name(ns.out.name + ".tmp")
  tmp.write_text(json.dumps(result, indent=1) + "\n")
  os.replace(tmp, ns.out)


if __name__ == "__main__":
  main()
