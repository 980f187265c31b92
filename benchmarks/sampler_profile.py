"""Where the sat_jax sampler's time goes: XLA op times from a profiler trace.

    .venv/bin/python benchmarks/sampler_profile.py --ckpt DIR [--dtype bfloat16]

Runs `sampling.sample` on the bench_foundation workload (batch 32, prompt
64, 64 new tokens) under `jax.profiler.trace`, sums the duration of every
XLA op on the CPU worker threads, names each op by the JAX source op in its
HLO metadata (e.g. `while/body/closed_call/btd,df->btf/dot_general`), and
prints the top ops with their share of all op time as JSON. Op times are
thread time, so on a loaded machine they include preemption: read them as
shares, not as absolute costs.
"""

import argparse
import collections
import glob
import json
import pathlib
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from sat_jax import models  # pylint: disable=g-import-not-at-top
from sat_jax import sampling  # pylint: disable=g-import-not-at-top

_OP = re.compile(r"^\s*%?([\w.-]+) = .*?op_name=\"([^\"]+)\"", re.M)
_CONTAINERS = ("ThunkExecutor", "SlinkyThreadPool", "while")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--ckpt", required=True)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--top", type=int, default=25)
  ns = parser.parse_args()
  config, params = models.load_hf(ns.ckpt, dtype=jnp.dtype(ns.dtype))
  b, p, n = 32, 64, 64
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(1, config.vocab_size, (b, p)), jnp.int32)
  mask = jnp.ones_like(prompts)
  opts = sampling.SamplingOptions(max_new_tokens=n)
  key = jax.random.key(0)
  args = (config, opts, params, prompts, mask, key)
  hlo = sampling._generate_jit.lower(*args).compile().as_text()  # pylint: disable=protected-access
  names = dict(_OP.findall(hlo))

  def run():
    return jax.block_until_ready(
        sampling.sample(config, params, prompts, mask, opts, key)
    )

  run()
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d):
      run()
    path = sorted(glob.glob(f"{d}/**/*.xplane.pb", recursive=True))[-1]
    data = jax.profiler.ProfileData.from_file(path)
  total = collections.Counter()
  calls = collections.Counter()
  for plane in data.planes:
    for line in plane.lines:
      if not line.name.startswith("tf_XLAEigen"):
        continue
      for ev in line.events:
        if ev.name.startswith(_CONTAINERS):
          continue  # spans that contain other ops
        src = names.get(ev.name, ev.name).removeprefix("jit(_generate)/")
        total[src] += ev.duration_ns
        calls[src] += 1
  all_ns = sum(total.values())
  rows = [
      {"op": k, "ms": v / 1e6, "share": v / all_ns, "calls": calls[k]}
      for k, v in total.most_common(ns.top)
  ]
  print(json.dumps({"ckpt": ns.ckpt, "dtype": ns.dtype, "top": rows}, indent=1))


if __name__ == "__main__":
  main()
