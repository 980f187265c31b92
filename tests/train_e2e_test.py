"""End-to-end tests of `train_and_evaluate`, and the tiny team they share.

The tiny team: random qwen3-tiny models with the offline tiny tokenizer, on
`ParityTask` (reward 1 when the team's last message has an even number of
characters), so that random agents get mixed rewards, non-zero advantages
and real updates. `tiny_train_config` is a 2-stage run of seconds of work
(its compiles dominate). Other test files import these helpers.
"""

import dataclasses
import json
import pathlib

import jax
import numpy as np
import pytest

from sat_jax import checkpoint as checkpoint_lib
from sat_jax import config as config_lib
from sat_jax import metrics as metrics_lib
from sat_jax import models
from sat_jax import testing
from sat_jax import train
from sat_jax.core import config as core_config
from sat_jax.core import stage as stage_lib
from sat_jax.tasks import base
from sat_jax.tasks import registry

PARITY = "test_parity"


@registry.register(PARITY)
class ParityTask(base.Task):
  """Fixed prompts; the answer is the message length's parity (0: even)."""

  name = PARITY

  def __init__(self, num_problems: int = 6):
    self.num_problems = num_problems

  def load(self, split):
    base.check_split(split, ("train", "test"))
    offset = 0 if split == "train" else 100
    return [
        base.Example(f"{split}{i}", f"Say {i + offset}.", "0")
        for i in range(self.num_problems)
    ]

  def extract_answer(self, text):
    return str(len(text) % 2)

  def check(self, example, answer):
    ok = answer == example.target
    return base.Verdict(float(ok), ok, answer, "" if ok else "odd length")


def make_tiny_model(path: pathlib.Path) -> tuple[str, str]:
  """(model dir, tokenizer dir) of a random qwen3-tiny and the tiny BPE."""
  tok_dir = testing.build_tiny_tokenizer(path / "tok")
  config = testing.tiny_config("qwen3")
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(7)
  )
  models.save_hf(path / "model", config, params)
  return str(path / "model"), str(tok_dir)


def tiny_train_config(
    model_dir: str, tok_dir: str, **changes
) -> config_lib.TrainConfig:
  """3 agents, relay, 2 stages of 2 prompts x 2 episodes, SAT reuse."""
  update = core_config.UpdateConfig(
      epochs=2,
      minibatches=1,
      optimizer=core_config.OptimizerConfig("adam", 3e-3, grad_clip=None),
  )
  config = config_lib.TrainConfig(
      team=tuple(
          config_lib.AgentEntry(
              name=f"a{j}", model=model_dir, tokenizer=tok_dir
          )
          for j in range(3)
      ),
      sat=core_config.SATConfig(
          delta=0.5,
          beta_init=0.01,
          max_backtracks=2,
          backtrack_step_scale=0.5,
          update=update,
      ),
      protocol=config_lib.ProtocolConfig(
          max_new_tokens=6, view_buckets=(64,), min_rows=64
      ),
      task=config_lib.TaskConfig(PARITY, {"num_problems": 6}),
      rollout=config_lib.RolloutConfig(prompts_per_stage=2, group_size=2),
      eval=config_lib.EvalConfig(num_problems=2, k=2, batch_size=2),
      num_stages=2,
      seed=3,
      name="tiny",
  )
  return dataclasses.replace(config, **changes)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> tuple[str, str]:
  return make_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def comparable_rows(workdir: pathlib.Path) -> list[dict]:
  """metrics.jsonl rows without the wall-time keys."""
  rows = metrics_lib.read_metrics(workdir / "metrics.jsonl")
  return [
      {k: v for k, v in r.items() if not k.startswith("time_")} for r in rows
  ]


def final_params(workdir: pathlib.Path, config, mesh=None):
  """The params of the run's last checkpoint, on the default device."""
  mesh = mesh or jax.make_mesh(
      (1, 1, 1),
      ("data", "fsdp", "tensor"),
      axis_types=(jax.sharding.AxisType.Auto,) * 3,
      devices=jax.devices()[:1],
  )
  task = registry.get_task(config.task.name, **config.task.kwargs)
  with jax.set_mesh(mesh):
    team = train.build_team(config, task, workdir, mesh, allow_pretrain=False)
    ckpt = checkpoint_lib.TeamCheckpointer(workdir / "checkpoints")
    state, _, cursor = ckpt.restore(
        ckpt.latest_step(), train.initial_state(team, config)
    )
    ckpt.close()
  return jax.device_get([s.params for s in state]), cursor


def test_rows_of_a_stage_without_a_trust_region_are_written(tmp_path):
  # delta = inf (no trust region) is valid; metric rows must stay finite.
  steps = (
      {"agent": 0, "accepted": True, "tries": 1},  # unmonitored: no KL
      {"agent": 1, "accepted": True, "kl_quantile": 0.02, "tries": 1},
  )
  record = stage_lib.StageRecord((0, 1), steps, None, 0.5)
  result = train.team_lib.RolloutResult(None, (), {"rollout_s": 1.0})
  _, agent_rows = train._stage_rows(record, [result], [float("inf"), 0.05])  # pylint: disable=protected-access
  writer = metrics_lib.MetricsWriter(tmp_path, enabled=True)
  for j, row in sorted(agent_rows.items()):
    writer.write(1, row, kind=f"agent{j}")
  writer.close()
  assert metrics_lib.read_metrics(tmp_path / "metrics.jsonl") == [
      {"step": 1, "kind": "agent0", "accepted": True, "tries": 1},
      {
          "step": 1,
          "kind": "agent1",
          "accepted": True,
          "kl_quantile": 0.02,
          "tries": 1,
          "delta": 0.05,
      },
  ]


def test_two_stages_write_every_output(tmp_path, tiny_model):
  config = tiny_train_config(*tiny_model)
  summary = train.train_and_evaluate(config, tmp_path, progress=False)
  rows = metrics_lib.read_metrics(tmp_path / "metrics.jsonl")
  kinds = [(r["step"], r["kind"]) for r in rows]
  assert kinds == [
      (0, "eval"),
      (1, "agent0"),
      (1, "agent1"),
      (1, "agent2"),
      (1, "eval"),
      (1, "stage"),
      (2, "agent0"),
      (2, "agent1"),
      (2, "agent2"),
      (2, "eval"),
      (2, "stage"),
  ]
  # The eval rows are the runner's summaries of its predictions.
  for step in (0, 1, 2):
    preds = [
        json.loads(line)
        for line in (
            (tmp_path / "eval" / f"step_{step}" / "predictions.jsonl")
            .read_text()
            .splitlines()
        )
    ]
    assert len(preds) == 2 * 2
    row = next(r for r in rows if r["kind"] == "eval" and r["step"] == step)
    assert row["avg@2"] == pytest.approx(np.mean([p["correct"] for p in preds]))
    assert summary["accuracy"][step] == row["avg@2"]
  # A stage's reward is the mean over its 4 episodes of the parity verdict.
  for stage in (1, 2):
    samples = (tmp_path / "samples" / f"stage_{stage}.jsonl").read_text()
    episodes = [json.loads(line) for line in samples.splitlines()]
    assert len(episodes) == 4
    for ep in episodes:
      last = ep["messages"][-1]["text"]
      assert ep["reward"] == float(len(last) % 2 == 0)
    stage_row = next(
        r for r in rows if r["kind"] == "stage" and r["step"] == stage
    )
    assert stage_row["reward"] == pytest.approx(
        np.mean([ep["reward"] for ep in episodes])
    )
    for j in range(3):
      agent = next(
          r for r in rows if r["kind"] == f"agent{j}" and r["step"] == stage
      )
      if agent["accepted"]:
        assert agent["kl_quantile"] <= agent["delta"]
  config_json = json.loads((tmp_path / "config.json").read_text())
  assert config_lib.from_dict(config_json) == config
  assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert checkpoint_lib.TeamCheckpointer(
      tmp_path / "checkpoints"
  ).all_steps() == [0, 1, 2]
  tb = metrics_lib.read_tensorboard_scalars(tmp_path / "tensorboard")
  assert [v for _, v in tb["stage/reward"]] == pytest.approx(
      [r["reward"] for r in rows if r["kind"] == "stage"]
  )
  # Someone trained: the params moved, and only through accepted updates.
  params, cursor = final_params(tmp_path, config)
  # The run's wall time so far rides along (the time budget counts it).
  assert cursor.pop("wall_s") > 0
  assert cursor == {"stage": 2, "num_stages": 2}
  start = jax.device_get(models.load_hf(tiny_model[0])[1])
  accepted = [
      any(r["accepted"] for r in rows if r["kind"] == f"agent{j}")
      for j in range(3)
  ]
  for j in range(3):
    moved = any(
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(params[j]), jax.tree.leaves(start))
    )
    assert moved == accepted[j]


def _eval_steps(workdir: pathlib.Path) -> list[int]:
  rows = metrics_lib.read_metrics(workdir / "metrics.jsonl")
  return [r["step"] for r in rows if r["kind"] == "eval"]


def test_a_budget_stop_evaluates_the_stage_it_stops_at(tmp_path, tiny_model):
  """Evaluation every 3 stages of 3, but the budget (passed at once) stops
  the run after stage 1: stage 1 is evaluated all the same, so the summary's
  final accuracy is the stopped team's. A rerun asking for fewer stages
  than the workdir holds is refused before anything is rewritten."""
  config = tiny_train_config(
      *tiny_model,
      num_stages=3,
      time_budget_s=1e-9,
      eval=config_lib.EvalConfig(
          num_problems=2, k=2, batch_size=2, every_stages=3
      ),
  )
  summary = train.train_and_evaluate(config, tmp_path, progress=False)
  assert summary["stopped_by_time_budget"]
  assert summary["stages_completed"] == 1
  assert _eval_steps(tmp_path) == [0, 1]
  assert sorted(summary["accuracy"]) == [0, 1]
  saved = (tmp_path / "config.json").read_text()
  with pytest.raises(ValueError, match="num_stages=0: .* holds stage 1"):
    train.train_and_evaluate(
        dataclasses.replace(config, num_stages=0), tmp_path, progress=False
    )
  assert (tmp_path / "config.json").read_text() == saved


def test_a_resume_with_nothing_to_train_evaluates_an_unevaluated_end(
    tmp_path, tiny_model, monkeypatch
):
  """A run with evaluation every 3 stages dies in stage 2 (after stage 1's
  checkpoint, which has no eval); resumed with num_stages=1 it has nothing
  to train, and evaluates stage 1, where it ends."""
  config = tiny_train_config(
      *tiny_model,
      num_stages=3,
      eval=config_lib.EvalConfig(
          num_problems=2, k=2, batch_size=2, every_stages=3
      ),
      checkpoint=config_lib.CheckpointConfig(async_save=False),
  )
  run_stage, calls = stage_lib.run_stage, []

  def dies_in_stage_2(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise RuntimeError("killed in stage 2")
    return run_stage(*args, **kwargs)

  monkeypatch.setattr(stage_lib, "run_stage", dies_in_stage_2)
  with pytest.raises(RuntimeError, match="killed in stage 2"):
    train.train_and_evaluate(config, tmp_path, progress=False)
  assert _eval_steps(tmp_path) == [0]
  summary = train.train_and_evaluate(
      dataclasses.replace(config, num_stages=1), tmp_path, progress=False
  )
  assert len(calls) == 2  # nothing trained on resume
  assert _eval_steps(tmp_path) == [0, 1]
  assert summary["stages_completed"] == 1
  assert summary["final_accuracy"] == summary["accuracy"][1]


def test_a_built_base_with_other_warm_start_settings_is_refused(
    tmp_path, tiny_model
):
  config = tiny_train_config(*tiny_model)
  base_dir = tmp_path / "pretrain" / "base"
  base_dir.mkdir(parents=True)
  settings = config_lib.to_plain(config.pretrain)
  info = {"settings": dict(settings, steps=settings["steps"] + 50, old=1)}
  (base_dir / "pretrain.json").write_text(json.dumps(info))
  with pytest.raises(ValueError, match=r"pretrain\.steps=.*\(config: "):
    train.pretrained_base(config, None, tmp_path)
  # The same settings (a key only one side has is not compared): reused.
  info["settings"]["steps"] = settings["steps"]
  (base_dir / "pretrain.json").write_text(json.dumps(info))
  assert train.pretrained_base(config, None, tmp_path) == base_dir


def test_the_time_budget_counts_the_whole_run_across_resumes(
    tmp_path, tiny_model
):
  """A resumed run's budget includes the wall time before it: with the
  budget set to what the first two stages took, the resume stops after one
  more stage (a budget per process would let it run on to stage 4)."""
  config = tiny_train_config(*tiny_model)
  first = train.train_and_evaluate(config, tmp_path, progress=False)
  ckpt = checkpoint_lib.TeamCheckpointer(tmp_path / "checkpoints")
  wall_2 = ckpt.restore_cursor(2)["wall_s"]
  ckpt.close()
  assert 0 < wall_2 <= first["time_wall_s"]
  resumed = dataclasses.replace(config, num_stages=4, time_budget_s=wall_2)
  summary = train.train_and_evaluate(resumed, tmp_path, progress=False)
  assert summary["stages_completed"] == 3
  assert summary["stopped_by_time_budget"]
  assert summary["time_wall_s"] > wall_2
  ckpt = checkpoint_lib.TeamCheckpointer(tmp_path / "checkpoints")
  assert ckpt.restore_cursor(3)["wall_s"] > wall_2
  ckpt.close()


@pytest.mark.parametrize("field", ["rollout", "eval"])
def test_an_unknown_split_names_its_field_before_anything_runs(
    tmp_path, tiny_model, field
):
  config = tiny_train_config(*tiny_model)
  part = dataclasses.replace(getattr(config, field), split="tset")
  config = dataclasses.replace(config, **{field: part})
  with pytest.raises(ValueError, match=rf"{field}\.split='tset': unknown"):
    train.train_and_evaluate(config, tmp_path, progress=False)
  assert not (tmp_path / "checkpoints").exists()
