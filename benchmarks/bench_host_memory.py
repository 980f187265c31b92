"""XLA CPU calls with freed pages reused vs faulted in fresh, in one process.

    .venv/bin/python benchmarks/bench_host_memory.py [--pairs 12]
        [--grpo_ckpt bench_out/team/bench-tiny]

`sat_jax.host_memory.reuse_freed_pages` is a process setting, and this
machine's speed drifts by 2x between processes, so the two settings are
compared inside one process, call by call: the process starts with one
malloc arena (as `reuse_freed_pages` sets it) and then switches glibc's
thresholds between each timed call:
  reuse  mmap threshold 1 GiB, trim threshold 2 GiB (`reuse_freed_pages`);
  fresh  both 128 KiB: every large buffer is mmap'ed and unmapped per call,
         which is what glibc's per-thread arenas do by default (their heaps
         cannot hold buffers of tens of MiB).
Each pair runs one untimed call after a switch, then the timed one. Each
workload runs in its own process: free chunks that an earlier workload left
in the heap would otherwise serve a later one's buffers in `fresh` too.
Workloads (float32): the model gradient of the GRPO benchmark (grad of
sum(token_logprobs), 32 x 80, bench-tiny architecture), the sampler (32 x 64
prompt + 64 new tokens) and scoring (32 x 128) on bench-tiny, and, with
--grpo_ckpt (bench_team.py's bench folder), the whole `single` GRPO step of
bench_team.py (team rollout + update). Prints a markdown table: medians,
the per-pair ratio fresh / reuse (median), the pairs reuse won, and the
median minor page faults per call of each setting.
"""

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
sys.path.insert(0, str(_HERE))

from sat_jax import host_memory  # pylint: disable=g-import-not-at-top

WORKLOADS = (
    "model gradient 32 x 80",
    "sampler 32 x (64 + 64)",
    "scoring 32 x 128",
)
GRPO_STEP = "GRPO step (rollout + update)"
# (mmap threshold, trim threshold) of each setting.
_SETTINGS = {
    "reuse": (host_memory.MMAP_THRESHOLD, host_memory.TRIM_THRESHOLD),
    "fresh": (128 << 10, 128 << 10),
}


def _switch(setting: str) -> None:
  # The first call also makes the one arena (host_memory does that once per
  # process); the thresholds change at once.
  if not host_memory.reuse_freed_pages(*_SETTINGS[setting]):
    raise SystemExit(
        "glibc malloc could not be set (not glibc, or"
        f" ${host_memory.ENV_VAR}=system)"
    )


def _workloads(grpo_ckpt):
  """name -> zero-argument callable that runs (and blocks on) one call."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import sampling  # pylint: disable=g-import-not-at-top
  from sat_jax import scoring  # pylint: disable=g-import-not-at-top
  from sat_jax.models import presets  # pylint: disable=g-import-not-at-top

  config = presets.get_preset("qwen3-bench-small")  # = bench-tiny's shapes
  params = models.init_params(config, jax.random.key(0))
  rng = np.random.default_rng(0)

  def ids(b, t):
    return jnp.asarray(rng.integers(1, config.vocab_size, (b, t)), jnp.int32)

  grad_tokens, score_tokens, prompts = ids(32, 80), ids(32, 128), ids(32, 64)
  grad = jax.jit(
      jax.grad(
          lambda p: jnp.sum(
              scoring.token_logprobs(
                  config, p, grad_tokens, jnp.ones_like(grad_tokens)
              )
          )
      )
  )
  score = jax.jit(
      lambda p: scoring.token_logprobs(
          config, p, score_tokens, jnp.ones_like(score_tokens)
      )
  )
  options = sampling.SamplingOptions(max_new_tokens=64)
  key = jax.random.key(1)
  out = {
      WORKLOADS[0]: lambda: jax.block_until_ready(grad(params)),
      WORKLOADS[1]: lambda: jax.block_until_ready(
          sampling.sample(
              config, params, prompts, jnp.ones_like(prompts), options, key
          )
      ),
      WORKLOADS[2]: lambda: jax.block_until_ready(score(params)),
  }
  if grpo_ckpt:
    out[GRPO_STEP] = _grpo_step(grpo_ckpt)
  return out


def _grpo_step(ckpt):
  """bench_team.py's sat_jax `single` step on the team rollout path."""
  import jax  # pylint: disable=g-import-not-at-top
  import team_grpo  # pylint: disable=g-import-not-at-top

  from sat_jax import models  # pylint: disable=g-import-not-at-top
  from sat_jax import team  # pylint: disable=g-import-not-at-top
  from sat_jax.core import agent as agent_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.core import stage  # pylint: disable=g-import-not-at-top

  config, params = models.load_hf(ckpt)
  params = jax.device_put(params, jax.devices()[0])
  agent = team.LMAgent(config, temperature=1.0)
  cfg = team_grpo._sat_config()  # pylint: disable=protected-access
  rollout = team_grpo._team_rollout(agent, models.load_tokenizer(ckpt))  # pylint: disable=protected-access
  state = [
      jax.device_put(
          agent_lib.init_team((agent,), (params,), cfg), jax.devices()[0]
      ),
      0,
  ]

  def step():
    state[1] += 1
    team_state, _ = stage.run_stage(
        (agent,), state[0], rollout, cfg, jax.random.key(state[1])
    )
    state[0] = jax.block_until_ready(team_state)

  return step


def _faults() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(fn, pairs: int) -> dict:
  times = {s: [] for s in _SETTINGS}
  faults = {s: [] for s in _SETTINGS}
  for _ in range(2):  # compile and warm up
    fn()
  for _ in range(pairs):
    for setting in _SETTINGS:
      _switch(setting)
      fn()  # settle into the setting
      f0, t0 = _faults(), time.perf_counter()
      fn()
      times[setting].append(time.perf_counter() - t0)
      faults[setting].append(_faults() - f0)
  ratios = [f / r for f, r in zip(times["fresh"], times["reuse"])]
  return {
      "reuse_s": statistics.median(times["reuse"]),
      "fresh_s": statistics.median(times["fresh"]),
      "ratio": statistics.median(ratios),
      "wins": sum(r > 1 for r in ratios),
      "pairs": pairs,
      "reuse_faults": statistics.median(faults["reuse"]),
      "fresh_faults": statistics.median(faults["fresh"]),
  }


def _in_child(name: str, ns) -> dict:
  """`measure` of one workload in a fresh process (see the docstring)."""
  cmd = [sys.executable, __file__, "--workload", name, "--pairs", str(ns.pairs)]
  if ns.grpo_ckpt:
    cmd += ["--grpo_ckpt", ns.grpo_ckpt]
  out = subprocess.run(cmd, capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pairs", type=int, default=12)
  parser.add_argument("--grpo_ckpt", default=None)
  parser.add_argument("--workload", default=None, help="(child process)")
  ns = parser.parse_args()
  if ns.workload is not None:
    _switch("reuse")  # one arena, before JAX starts its threads
    fn = _workloads(ns.grpo_ckpt)[ns.workload]
    sys.stdout.write(json.dumps(measure(fn, ns.pairs)) + "\n")
    return
  rows = [
      (
          "| workload | reuse ms | fresh ms | fresh / reuse (median of pairs)"
          " | pairs reuse won | page faults per call (reuse / fresh) |"
      ),
      "| --- | ---: | ---: | ---: | ---: | ---: |",
  ]
  names = WORKLOADS + ((GRPO_STEP,) if ns.grpo_ckpt else ())
  for name in names:
    r = _in_child(name, ns)
    rows.append(
        f"| {name} | {1e3 * r['reuse_s']:.0f} | {1e3 * r['fresh_s']:.0f} |"
        f" {r['ratio']:.2f} | {r['wins']} / {r['pairs']} |"
        f" {r['reuse_faults']:,.0f} / {r['fresh_faults']:,.0f} |"
    )
    sys.stdout.write(rows[-1] + "\n")
    sys.stdout.flush()
  sys.stdout.write("\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
  main()
