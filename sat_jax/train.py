"""The main job: `train_and_evaluate(config, workdir, mesh)`, SAT on an LM team.

One readable loop. Per stage s = 1..num_stages, with every random draw keyed
by `fold_in(key, s)` (the rollout's prompts included, which the team rollout
draws from its key): a team rollout (`sat_jax.team`), one SAT stage
(`sat_jax.core.run_stage`), metrics rows, held-out team accuracy, the plot,
then a team checkpoint, which is the commit point of the stage.

Workdir:
  config.json              the effective config
  metrics.jsonl            rows of kind "pretrain", "stage", "agent<j>", "eval"
  tensorboard/             the same scalars (no TensorFlow)
  checkpoints/<s>/         team checkpoints; s = 0 is the starting team
  eval/step_<s>/           predictions.jsonl, summary.json, summary.md
  samples/stage_<s>.jsonl  the first episodes of each stage's rollout
  plot.png                 accuracy and certificate terms per stage
  summary.json             accuracy per stage and the run's totals
  pretrain/base/           the warm-start base when an entry says "pretrain"

Resume: rerunning in the same workdir restores the latest checkpoint (its
cursor names the stage), drops the metrics rows of later steps (a stage that
was killed half-way), rebuilds the TensorBoard events from the kept rows,
and continues; the final parameters and metrics equal an uninterrupted
run's. Keys of rows starting with "time_" are wall times (not reproducible).
"""

import dataclasses
import json
import math
import pathlib
import shutil
import time
from typing import Any, Sequence

from absl import logging
import jax
import numpy as np
import tensorboardX
import tqdm

from sat_jax import checkpoint as checkpoint_lib
from sat_jax import config as config_lib
from sat_jax import io_utils
from sat_jax import metrics as metrics_lib
from sat_jax import models
from sat_jax import multihost
from sat_jax import plots
from sat_jax import sft
from sat_jax import sharding
from sat_jax import team as team_lib
from sat_jax.core import agent as agent_lib
from sat_jax.core import stage as stage_lib
from sat_jax.eval import runner
from sat_jax.tasks import base
from sat_jax.tasks import registry

PyTree = Any
# Config fields a resumed run may change (everything else must match).
RESUMABLE_CHANGES = ("num_stages", "time_budget_s")
_SAMPLES_PER_STAGE = 8


@dataclasses.dataclass(frozen=True)
class Team:
  """The agents of a run, their tokenizers and their starting parameters."""

  agents: tuple[team_lib.LMAgent, ...]
  tokenizers: tuple[Any, ...]
  params: tuple[PyTree, ...]
  metas: tuple[dict[str, Any], ...]  # per agent, saved with checkpoints


def _check_base_settings(path: pathlib.Path, cfg: Any) -> None:
  """Refuses a built base whose warm-start settings are not `cfg`'s (a base
  from `sat-jax pretrain --config.pretrain.steps=50` would otherwise start
  a run whose config.json says 600). Settings one side lacks (written by
  another version) are not compared."""
  info_path = path / sft.INFO_FILE
  if not info_path.is_file():
    return
  built = io_utils.read_json(info_path).get("settings") or {}
  wanted = json.loads(json.dumps(config_lib.to_plain(cfg)))  # as stored
  diff = sorted(
      k for k in built.keys() & wanted.keys() if built[k] != wanted[k]
  )
  if diff:
    shown = ", ".join(
        f"pretrain.{k}={built[k]!r} (config: {wanted[k]!r})" for k in diff
    )
    raise ValueError(
        f"{path} was built with {shown}; remove it to rebuild the warm start,"
        " or run with the settings it was built with"
    )


def pretrained_base(
    config: config_lib.TrainConfig,
    task: base.Task,
    workdir: pathlib.Path,
    *,
    build: bool = True,
) -> pathlib.Path:
  """workdir/pretrain/base, built by the warm start unless it exists."""
  path = workdir / "pretrain" / "base"
  if path.is_dir():
    _check_base_settings(path, config.pretrain)
    logging.info("warm start: reusing %s", path)
    return path
  if not build:
    raise FileNotFoundError(
        f"{path}: the run's pretrained base is missing (its team entries say"
        f" {config_lib.PRETRAIN!r})"
    )
  logging.info("warm start: building %s", path)
  sft.pretrain(
      config.pretrain,
      task,
      path,
      protocol=config.protocol,
      num_agents=config.num_agents,
      progress=True,
  )
  return path


def build_team(
    config: config_lib.TrainConfig,
    task: base.Task,
    workdir: pathlib.Path,
    mesh: jax.sharding.Mesh,
    *,
    allow_pretrain: bool = True,
) -> Team:
  """Loads every agent's model and tokenizer; params sharded on `mesh`.

  Entries that say "pretrain" share workdir/pretrain/base, which is built
  first if missing (an error instead without `allow_pretrain`).
  """
  base_dir = None
  agents, tokenizers, params, metas = [], [], [], []
  for j, entry in enumerate(config.team):
    if entry.model == config_lib.PRETRAIN:
      if base_dir is None:
        base_dir = pretrained_base(config, task, workdir, build=allow_pretrain)
      model_dir = base_dir
    else:
      model_dir = pathlib.Path(entry.model)
    tok_dir = pathlib.Path(entry.tokenizer or model_dir)
    tokenizer = models.load_tokenizer(tok_dir)
    model_config = models.config_from_hf(model_dir)
    dtype = jax.numpy.dtype(entry.dtype)
    abstract = jax.eval_shape(
        lambda k, c=model_config: models.init_params(c, k, dtype),
        jax.random.key(0),
    )
    shardings = sharding.logical_to_sharding(
        models.param_axes(model_config), mesh, shapes=abstract
    )
    _, agent_params = models.load_hf(model_dir, dtype, shardings=shardings)
    agents.append(team_lib.LMAgent(model_config, config.agent_temperature(j)))
    tokenizers.append(tokenizer)
    params.append(agent_params)
    metas.append({
        "name": entry.name,
        "model": str(model_dir),
        "tokenizer": str(tok_dir),
        "dtype": entry.dtype,
        "temperature": config.agent_temperature(j),
        "model_config": config_lib.to_plain(model_config),
    })
  return Team(tuple(agents), tuple(tokenizers), tuple(params), tuple(metas))


def initial_state(
    team: Team, config: config_lib.TrainConfig
) -> agent_lib.TeamState:
  """The core's team state, with the per-agent beta_init and delta."""
  return agent_lib.init_team(team.agents, team.params, config.sat_config())


def restore_team(
    config: config_lib.TrainConfig,
    task: base.Task,
    workdir: pathlib.Path,
    mesh: jax.sharding.Mesh,
    step: int | None = None,
) -> tuple[Team, agent_lib.TeamState, tuple[dict, ...], int]:
  """(team, states, metas, step) of a run's checkpoint (default: latest).

  Read-only: the run may still be training in `workdir`. Call it under
  `mesh` (the parameters land there).
  """
  team = build_team(config, task, workdir, mesh, allow_pretrain=False)
  with checkpoint_lib.TeamCheckpointer(
      workdir / "checkpoints", read_only=True
  ) as ckpt:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise checkpoint_lib.CheckpointError(
          f"{workdir}/checkpoints holds no team checkpoint"
      )
    states, metas, _ = ckpt.restore(step, initial_state(team, config))
  return team, states, metas, step


def load_split(task: base.Task, split: str, field: str) -> list[Any]:
  """task.load(split), its error naming the config field that chose it."""
  try:
    return list(task.load(split))
  except ValueError as e:
    raise ValueError(f"{field}={split!r}: {e}") from e


def stage_rollout_fn(
    config: config_lib.TrainConfig,
    team: Team,
    task: base.Task,
    examples: Sequence[Any] | None = None,
) -> team_lib.LMRollout:
  """The team rollout of one stage: config.rollout's prompts and groups
  (over `examples`, default: the rollout split)."""
  if examples is None:
    examples = load_split(task, config.rollout.split, "rollout.split")
  return team_lib.make_rollout_fn(
      team.agents,
      team.tokenizers,
      task,
      examples,
      config.protocol,
      num_prompts=config.rollout.prompts_per_stage,
      group_size=config.rollout.group_size,
      **sampling_mesh(config),
  )


def sampling_mesh(config: config_lib.TrainConfig) -> dict[str, Any]:
  """The speaker's `sampling_mesh` / `sampling_rules` of `rollout.mesh`."""
  m = config.rollout.mesh
  if m is None:
    return {}
  return {
      "sampling_mesh": sharding.make_mesh(m),
      "sampling_rules": m.logical_rules(),
  }


def evaluate_team(
    team: Team,
    params: Sequence[PyTree],
    task: base.Task,
    examples: Sequence[base.Example],
    config: config_lib.TrainConfig,
    key: jax.Array,
    out_dir: pathlib.Path,
    *,
    k: int | None = None,
    protocol: team_lib.ProtocolConfig | None = None,
    progress: bool = False,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
  """runner.evaluate of the team on `examples` (K samples each)."""
  generate = team_lib.make_generate_fn(
      team.agents,
      team.tokenizers,
      task,
      protocol or config.protocol,
      params,
      temperature=config.eval.temperature,
      **sampling_mesh(config),
  )
  return runner.evaluate(
      task,
      examples,
      generate,
      config.eval.k if k is None else k,
      key,
      out_dir,
      progress=progress,
      batch_size=config.eval.batch_size,
      meta=meta,
  )


def load_run_config(workdir: pathlib.Path) -> config_lib.TrainConfig:
  """The TrainConfig of a run directory, with clear errors for a wrong one."""
  workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise FileNotFoundError(f"workdir {workdir}: no such directory")
  path = workdir / "config.json"
  if not path.is_file():
    raise FileNotFoundError(
        f"{workdir} is not a `sat-jax train` run directory (no config.json)"
    )
  if not (workdir / "checkpoints").is_dir():
    raise FileNotFoundError(f"{workdir}: no checkpoints/ folder")
  return config_lib.from_dict(io_utils.read_json(path))


def eval_row(summary: dict[str, Any]) -> dict[str, Any]:
  row = {}
  for key, value in summary.items():
    if key in ("generate_s", "score_s"):
      row[f"time_{key}"] = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      row[key] = value
  return row


def _stage_rows(
    record: stage_lib.StageRecord,
    results: Sequence[team_lib.RolloutResult],
    deltas: Sequence[float],
) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
  """(the stage row, {agent: its step row}) of one stage."""
  stats = results[0].stats
  row: dict[str, Any] = {"reward": record.mean_reward, "rollouts": len(results)}
  for key, value in stats.items():
    if key.endswith("_s"):
      row[f"time_{key}"] = value
    elif key not in ("reward_mean",):
      row[f"rollout_{key}"] = value
  row["time_rollout_s"] = sum(r.stats["rollout_s"] for r in results)
  steps = {s["agent"]: dict(s) for s in record.steps}
  accepted = [s for s in steps.values() if s["accepted"]]
  row["accepted"] = len(accepted)
  row["updates"] = len(steps)
  # Steps without a trust region (delta = inf) have no measured KL.
  kls = [s["kl_quantile"] for s in accepted if "kl_quantile" in s]
  if kls or not accepted:
    row["max_kl_quantile"] = max(kls, default=0)
  row["inside_trust_region"] = all(
      s.get("kl_quantile", 0.0) <= deltas[j]
      for j, s in steps.items()
      if s["accepted"]
  )
  if record.certificate is not None:
    for term in plots.CERT_TERMS:
      row[f"cert_{term}"] = record.certificate[term]
  agent_rows = {}
  for j, s in steps.items():
    s.pop("agent")
    # delta = inf (no trust region) is left out: metric rows are finite.
    if math.isfinite(deltas[j]):
      s["delta"] = deltas[j]
    agent_rows[j] = s
  return row, agent_rows


def _write_samples(path: pathlib.Path, result: team_lib.RolloutResult):
  rows = [
      {
          "uid": r.uid,
          "reward": r.reward,
          "answer": r.verdict.answer,
          "messages": [m.to_json() for m in r.messages],
      }
      for r in result.episodes[:_SAMPLES_PER_STAGE]
  ]
  io_utils.atomic_write_jsonl(path, rows)


def log_row(writer, rows: list, step: int, row: dict, kind: str) -> dict:
  """Writes one metrics row and keeps it (with step and kind) in `rows`."""
  rows.append(dict(writer.write(step, row, kind=kind), step=step, kind=kind))
  return rows[-1]


def _pretrain_row(info: dict[str, Any]) -> dict[str, Any]:
  row = {
      k: v
      for k, v in info.get("eval", {}).items()
      if isinstance(v, (int, float)) and v is not None
  }
  row["loss_last"] = info["loss_last"]
  row["time_train_s"] = info["train_s"]
  return row


def _check_resumable(saved: dict[str, Any], current: dict[str, Any]) -> None:
  try:  # fields added since the run started compare at their defaults
    saved = config_lib.to_dict(config_lib.from_dict(saved))
  except ValueError:
    pass  # reported below as a difference
  diff = sorted(
      k
      for k in set(saved) | set(current)
      if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k)
  )
  if diff:
    raise ValueError(
        f"the workdir's config.json differs from this config in {diff}; use"
        f" a new workdir (a resumed run may only change {RESUMABLE_CHANGES})"
    )


def _truncate_metrics(
    workdir: pathlib.Path, last_step: int | None, *, write: bool = True
) -> list:
  """Keeps the rows of steps <= last_step (none if None); TB rebuilt.

  Without `write` (a process other than the first) only the kept rows are
  returned; the files are left to the first process.
  """
  path = workdir / "metrics.jsonl"
  rows = []
  if path.exists() and path.stat().st_size and last_step is not None:
    rows = metrics_lib.read_metrics(path)
    rows = [r for r in rows if r["step"] <= last_step]
  if not write:
    return rows
  io_utils.atomic_write_jsonl(path, rows)
  tb_dir = workdir / "tensorboard"
  shutil.rmtree(tb_dir, ignore_errors=True)
  if rows:
    # Its own file name: tensorboardX names event files by the second and
    # opens them with "wb", so the run's writer, opened right after in the
    # same folder, would otherwise truncate this history.
    tb = tensorboardX.SummaryWriter(
        logdir=str(tb_dir), filename_suffix=".resumed"
    )
    for r in rows:
      for key, value in r.items():
        if key not in ("step", "kind") and isinstance(value, (int, float)):
          tb.add_scalar(f"{r['kind']}/{key}", float(value), r["step"])
    tb.close()
  return rows


def _summary(rows, pretrain_info, wall_s, stopped_early) -> dict[str, Any]:
  acc_key = plots.accuracy_key(rows)
  acc = {r["step"]: r[acc_key] for r in rows if r["kind"] == "eval" and acc_key}
  stages = [r for r in rows if r["kind"] == "stage"]
  out = {
      "accuracy_key": acc_key,
      "accuracy": acc,
      "stages_completed": len(stages),
      "all_accepted_inside_trust_region": all(
          r["inside_trust_region"] for r in stages
      ),
      "accepted_updates": sum(r["accepted"] for r in stages),
      "updates": sum(r["updates"] for r in stages),
      "stopped_by_time_budget": stopped_early,
      "time_wall_s": round(wall_s, 1),
      "pretrain": pretrain_info,
  }
  if acc:
    first, last = acc[min(acc)], acc[max(acc)]
    out.update(
        initial_accuracy=first,
        final_accuracy=last,
        gain_points=round(100 * (last - first), 2),
    )
  return out


def train_and_evaluate(
    config: config_lib.TrainConfig,
    workdir: str | pathlib.Path,
    mesh: jax.sharding.Mesh | None = None,
    *,
    progress: bool = True,
) -> dict[str, Any]:
  """Runs (or resumes) the whole job in `workdir`; returns summary.json."""
  t_start = time.perf_counter()
  workdir = io_utils.local_path(workdir, "workdir")
  workdir.mkdir(parents=True, exist_ok=True)
  mesh = sharding.make_mesh(config.mesh) if mesh is None else mesh
  sampling_mesh(config)  # a bad rollout.mesh fails here, early
  task = registry.get_task(config.task.name, **config.task.kwargs)
  effective = config_lib.to_dict(config)
  if (workdir / "config.json").exists():
    saved = io_utils.read_json(workdir / "config.json")
    _check_resumable(saved, effective)
  # Both splits before the warm start, which may take minutes.
  rollout_examples = load_split(task, config.rollout.split, "rollout.split")
  eval_examples = load_split(task, config.eval.split, "eval.split")[
      : config.eval.num_problems
  ]
  # The warm start runs on one device, before the mesh is entered; on
  # several processes the first builds it and the others wait, then load it.
  if any(e.model == config_lib.PRETRAIN for e in config.team):
    if multihost.is_primary():
      pretrained_base(config, task, workdir)
    multihost.barrier("sat_jax.train.pretrained_base")
  key = jax.random.key(config.seed)
  key_stage, key_eval = jax.random.split(key)
  with jax.set_mesh(mesh), sharding.logical_rules(config.mesh.logical_rules()):
    team = build_team(config, task, workdir, mesh)
    state = initial_state(team, config)
    sat_cfg = config.sat_config()
    deltas = config.agent_deltas()
    rollout_fn = stage_rollout_fn(config, team, task, rollout_examples)
    ckpt = checkpoint_lib.TeamCheckpointer(
        workdir / "checkpoints",
        max_to_keep=config.checkpoint.max_to_keep,
        async_save=config.checkpoint.async_save,
    )
    last = ckpt.latest_step()
    if last is not None and last > config.num_stages:
      raise ValueError(
          f"num_stages={config.num_stages}: {workdir} already holds stage"
          f" {last}; resume with num_stages >= {last} or use a new workdir"
      )
    # No barrier needed: the rewrite is atomic, and every process keeps the
    # same rows whether it reads the file before or after it.
    rows = _truncate_metrics(workdir, last, write=multihost.is_primary())
    # Wall time of the run before this process, up to its last checkpoint
    # (time_budget_s and summary.json's time_wall_s count the whole run).
    wall_before = 0.0
    if last is not None:
      state, _, cursor = ckpt.restore(last, state)
      start = int(cursor["stage"])
      wall_before = float(cursor.get("wall_s", 0.0))
      logging.info("resuming after stage %d from %s", start, ckpt.directory)
    writer = metrics_lib.MetricsWriter(workdir)
    writer.write_config(effective)
    info_path = workdir / "pretrain" / "base" / sft.INFO_FILE
    pretrain_info = (
        io_utils.read_json(info_path) if info_path.exists() else None
    )

    def evaluate(step: int) -> dict[str, Any] | None:
      if not eval_examples:
        return None
      summary = evaluate_team(
          team,
          agent_lib.team_params(state),
          task,
          eval_examples,
          config,
          jax.random.fold_in(key_eval, step),
          workdir / "eval" / f"step_{step}",
      )
      log_row(writer, rows, step, eval_row(summary), "eval")
      return summary

    def plot() -> None:
      if multihost.is_primary():
        plots.plot_run(
            rows, workdir / "plot.png", config.name, config.num_agents
        )

    def commit(stage: int) -> None:
      plot()
      cursor = {
          "stage": stage,
          "num_stages": config.num_stages,
          "wall_s": wall_before + time.perf_counter() - t_start,
      }
      ckpt.save(stage, state, team.metas, cursor)

    if last is None:
      start = 0
      if pretrain_info is not None:
        log_row(writer, rows, 0, _pretrain_row(pretrain_info), "pretrain")
      evaluate(0)
      commit(0)

    stopped_early, end = False, start
    bar = tqdm.tqdm(
        total=config.num_stages, initial=start, desc="SAT", disable=not progress
    )
    for stage in range(start + 1, config.num_stages + 1):
      t0 = time.perf_counter()
      state, record = stage_lib.run_stage(
          team.agents,
          state,
          rollout_fn,
          sat_cfg,
          jax.random.fold_in(key_stage, stage),
      )
      results = rollout_fn.pop_results()
      t_update = time.perf_counter() - t0
      stage_row, agent_rows = _stage_rows(record, results, deltas)
      if multihost.is_primary():
        _write_samples(workdir / "samples" / f"stage_{stage}.jsonl", results[0])
      for j, agent_row in sorted(agent_rows.items()):
        log_row(writer, rows, stage, agent_row, f"agent{j}")
      summary = None
      t1 = time.perf_counter()
      # The budget is decided before the eval, so that the stage a run
      # stops at is always evaluated (its summary's final accuracy).
      elapsed = wall_before + t1 - t_start
      over_budget = multihost.primary_decides(
          bool(config.time_budget_s) and elapsed >= config.time_budget_s
      )
      if (
          stage % config.eval.every_stages == 0
          or stage == config.num_stages
          or over_budget
      ):
        summary = evaluate(stage)
      stage_row["time_eval_s"] = time.perf_counter() - t1
      stage_row["time_update_s"] = t_update - stage_row["time_rollout_s"]
      stage_row["time_stage_s"] = time.perf_counter() - t0
      log_row(writer, rows, stage, stage_row, "stage")
      commit(stage)
      end = stage
      postfix = {
          "reward": f"{record.mean_reward:.3f}",
          "kl": f"{stage_row.get('max_kl_quantile', math.nan):.4f}",
      }
      if summary is not None:
        postfix["acc"] = f"{summary[plots.accuracy_key(rows)]:.3f}"
      bar.set_postfix(postfix)
      bar.update(1)
      if over_budget:
        logging.info(
            "time budget %.0f s reached after stage %d (%.0f s)",
            config.time_budget_s,
            stage,
            elapsed,
        )
        stopped_early = stage < config.num_stages
        break
    bar.close()
    if not any(r["kind"] == "eval" and r["step"] == end for r in rows):
      # A resumed run with nothing left to train whose last stage was never
      # evaluated (it stopped on its time budget before the stop evaluated).
      if evaluate(end) is not None:
        plot()
    ckpt.wait_until_finished()
    ckpt.close()
    writer.close()
  summary = _summary(
      rows,
      pretrain_info,
      wall_before + time.perf_counter() - t_start,
      stopped_early,
  )
  if multihost.is_primary():
    io_utils.atomic_write_json(workdir / "summary.json", summary)
  logging.info("run summary: %s", summary)
  return summary
