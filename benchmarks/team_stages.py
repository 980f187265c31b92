"""Stage workers of bench_team.py: the demo's per-stage breakdown, scaling in n.

Both run the real main job, `sat_jax.train.train_and_evaluate`, on
`experiments/demo.py`'s config, instrumented from outside (team_phases.py):
`train.team_lib.make_rollout_fn` and `train.stage_lib.run_stage` are
wrapped while it runs, so every stage's `run_stage` call is split into
rollout / update / backtracks / scoring / other, and the rollout's own
stats (host rendering, sampler, decoding) come from its RolloutResult.

demo     the demo config as is (3 agents, relay, reuse, held-out eval after
         every stage), `stages` stages; the pretrained base is built once
         into <out>/demo_base by the demo's own warm start (or `demo_base`
         is used). Per stage: run_stage phases, the eval and the period
         between stage starts (eval, metrics and checkpoint included).
scaling  for each n and mode (reuse, resample): the demo config with n
         agents that all start from the demo base, no held-out eval,
         `warmup` + `stages` stages in one process (compiled functions are
         shared across runs, so later runs compile only new shapes). The
         base is copied with max_position_embeddings raised to
         `max_seq_len` (RoPE: no learned positions) so that 6 agents' relay
         transcripts fit, and views are padded to multiples of 32 (each
         agent's update compiles for its own length bucket).
"""

import hashlib
import importlib.util
import json
import pathlib
import shutil
import statistics
import time
from typing import Any

import team_phases

_REPO = pathlib.Path(__file__).resolve().parent.parent


def _demo_config(arg: str | None):
  spec = importlib.util.spec_from_file_location(
      "demo_config", _REPO / "experiments" / "demo.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


class _TimedRollout:
  """An LMRollout whose calls are timed; everything else is delegated.

  `view_lengths` collects T of every agent view of every rollout.
  """

  def __init__(self, inner, timer: team_phases.PhaseTimer):
    self._inner, self._call = inner, timer.rollout(inner)
    self.view_lengths: list[list[int]] = []

  def __call__(self, params, key):
    batch = self._call(params, key)
    self.view_lengths.append([v.mask_ExT.shape[1] for v in batch.views])
    return batch

  def __getattr__(self, name):
    return getattr(self._inner, name)


def _instrumented_run(config, workdir: pathlib.Path) -> list[dict[str, Any]]:
  """train_and_evaluate in a fresh workdir; per-stage phase dicts."""
  from sat_jax import train  # pylint: disable=g-import-not-at-top

  from sat_jax import sampling  # pylint: disable=g-import-not-at-top
  from sat_jax.core import tracing  # pylint: disable=g-import-not-at-top

  timer, stages, rollouts = team_phases.PhaseTimer(), [], []

  def traces() -> int:
    return sampling.num_traces() + sum(tracing.trace_counts().values())

  make_rollout_fn = train.team_lib.make_rollout_fn
  run_stage = train.stage_lib.run_stage

  def timed_make(*args, **kwargs):
    rollouts.append(_TimedRollout(make_rollout_fn(*args, **kwargs), timer))
    return rollouts[-1]

  def timed_run_stage(*args, **kwargs):
    start, traced = time.perf_counter(), traces()
    timer.take()  # drop anything timed between stages
    team, record, phases = team_phases.timed_stage(
        run_stage, timer, *args, **kwargs
    )
    # The cost of the stage had every first try been accepted.
    phases["no_backtracks_s"] = phases["stage_s"] - phases["backtracks_s"]
    phases.update(
        start=start,
        traces=traces() - traced,  # > 0: this stage compiled something
        view_lengths=rollouts[-1].view_lengths[-1],
        tries=[s["tries"] for s in record.steps],
        accepted=[bool(s["accepted"]) for s in record.steps],
    )
    stages.append(phases)
    return team, record

  train.team_lib.make_rollout_fn = timed_make
  train.stage_lib.run_stage = timed_run_stage
  try:
    with timer.installed():
      train.train_and_evaluate(config, workdir, progress=False)
  finally:
    train.team_lib.make_rollout_fn = make_rollout_fn
    train.stage_lib.run_stage = run_stage
  rows = [
      json.loads(line)
      for line in (workdir / "metrics.jsonl").read_text().splitlines()
  ]
  by_stage = {r["step"]: r for r in rows if r["kind"] == "stage"}
  for i, phases in enumerate(stages):
    row = by_stage.get(i + 1, {})
    for key in ("time_eval_s", "time_render_s", "time_sample_s"):
      phases[key[5:]] = row.get(key)
    phases["decode_s"] = row.get("time_decode_s")
    phases["episodes"] = config.rollout.num_episodes
    phases["reward"] = row.get("reward")
    if i + 1 < len(stages):
      phases["period_s"] = stages[i + 1]["start"] - phases["start"]
  return stages


def _fresh(path: pathlib.Path) -> pathlib.Path:
  shutil.rmtree(path, ignore_errors=True)
  path.mkdir(parents=True)
  return path


def demo_base(args: dict[str, Any], config, task) -> pathlib.Path:
  """The demo's pretrained base: args["demo_base"] or built once."""
  from sat_jax import train  # pylint: disable=g-import-not-at-top

  from sat_jax import config as config_lib  # pylint: disable=g-import-not-at-top

  if args.get("demo_base"):
    return pathlib.Path(args["demo_base"])
  # Keyed by everything the warm start reads, so an edited demo config
  # gets its own base instead of a stale one.
  settings = config_lib.to_plain(
      [config.pretrain, config.task, config.protocol, config.num_agents]
  )
  digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode())
  out = pathlib.Path(args["out_dir"]) / "demo_base" / digest.hexdigest()[:12]
  return train.pretrained_base(config, task, out)


def _with_base(config, base: pathlib.Path, workdir: pathlib.Path):
  """Links workdir/pretrain/base to the shared base (the run reuses it)."""
  link = workdir / "pretrain" / "base"
  link.parent.mkdir(parents=True)
  link.symlink_to(base.absolute(), target_is_directory=True)
  return config


def _summary(stages: list[dict[str, Any]], skip: int) -> dict[str, Any]:
  keep = stages[skip:] or stages
  keys = [
      k
      for k, v in keep[0].items()
      if isinstance(v, (int, float)) and k != "start"
  ]
  out = {}
  for k in keys:
    values = [s[k] for s in keep if isinstance(s.get(k), (int, float))]
    if values:
      out[k] = statistics.median(values)
  out["tries_mean"] = statistics.mean(t for s in keep for t in s["tries"])
  out["episodes_per_s"] = (
      out["episodes"] * out["rollout_calls"] / out["stage_s"]
  )
  out["measured_stages"] = len(keep)
  out["traces_measured"] = sum(s["traces"] for s in keep)
  return out


def run_demo(args: dict[str, Any]) -> dict[str, Any]:
  from sat_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.tasks import registry  # pylint: disable=g-import-not-at-top

  c = _demo_config(args.get("demo_arg"))
  c.num_stages = args["stages"]
  config = config_lib.from_dict(c)
  task = registry.get_task(config.task.name, **config.task.kwargs)
  t0 = time.perf_counter()
  base = demo_base(args, config, task)
  base_s = time.perf_counter() - t0
  workdir = _fresh(pathlib.Path(args["out_dir"]) / "demo_run")
  _with_base(config, base, workdir)
  stages = _instrumented_run(config, workdir)
  summary = json.loads((workdir / "summary.json").read_text())
  return {
      "config": {
          "agents": config.num_agents,
          "protocol": config.protocol.protocol,
          "advantage_mode": config.sat.advantage_mode,
          "episodes_per_stage": config.rollout.num_episodes,
          "max_new_tokens": config.protocol.max_new_tokens,
          "epochs": config.sat.update.epochs,
          "minibatches": config.sat.update.minibatches,
          "max_backtracks": config.sat.max_backtracks,
          "eval_problems": config.eval.num_problems,
          "eval_k": config.eval.k,
      },
      "base": str(base),
      "base_build_s": base_s,
      "stages": stages,
      "summary": _summary(stages, 1),
      "accuracy": summary.get("accuracy"),
  }


def _scaling_base(base: pathlib.Path, out: pathlib.Path, max_seq_len: int):
  if not (out / "config.json").is_file():
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns("eval"))
    hf = json.loads((tmp / "config.json").read_text())
    hf["max_position_embeddings"] = max_seq_len
    (tmp / "config.json").write_text(json.dumps(hf, indent=1))
    tmp.rename(out)
  return out


def run_scaling(args: dict[str, Any]) -> dict[str, Any]:
  from sat_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.tasks import registry  # pylint: disable=g-import-not-at-top

  c = _demo_config(args.get("demo_arg"))
  config = config_lib.from_dict(c)
  task = registry.get_task(config.task.name, **config.task.kwargs)
  out_dir = pathlib.Path(args["out_dir"])
  max_len = args.get("max_seq_len", 1024)
  base = _scaling_base(
      demo_base(args, config, task), out_dir / "scaling_base", max_len
  )
  rows = []
  for n in args["agents"]:
    for mode in args["modes"]:
      c = _demo_config(args.get("demo_arg"))
      c.team = [dict(name=f"agent{j}", model=str(base)) for j in range(n)]
      c.num_stages = args["warmup"] + args["stages"]
      c.sat.advantage_mode = mode
      c.eval.num_problems = 0
      c.protocol.view_buckets = tuple(range(32, max_len + 1, 32))
      config = config_lib.from_dict(c)
      workdir = _fresh(out_dir / "scaling_run")
      t0 = time.perf_counter()
      stages = _instrumented_run(config, workdir)
      row = _summary(stages, args["warmup"])
      row.update(
          agents=n,
          mode=mode,
          run_s=time.perf_counter() - t0,
          stage_times_s=[s["stage_s"] for s in stages],
          view_lengths=stages[-1]["view_lengths"],
      )
      rows.append(row)
  return {"base": str(base), "rows": rows}


def run(args: dict[str, Any]) -> dict[str, Any]:
  """args["part"]: "demo" or "scaling" (module docstring)."""
  return {"demo": run_demo, "scaling": run_scaling}[args["part"]](args)
