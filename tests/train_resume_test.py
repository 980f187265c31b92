"""Resume: kill -9 mid-stage, rerun, and end where an unbroken run ends."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from sat_jax import checkpoint as checkpoint_lib
from sat_jax import config as config_lib
from sat_jax import metrics as metrics_lib
from sat_jax import train
from sat_jax.core import stage as stage_lib

_TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
import train_e2e_test as e2e  # pylint: disable=g-import-not-at-top,wrong-import-position

tiny_model = e2e.tiny_model  # the session fixture

# Runs the tiny config on one device. With HANG_AT=n it stops forever inside
# the n-th commit, after the stage's metrics rows and before its checkpoint:
# a stage killed half-way.
_DRIVER = textwrap.dedent("""
    import os, pathlib, sys, time
    sys.path.insert(0, {tests!r})
    from absl import logging
    import jax
    import train_e2e_test as e2e
    from sat_jax import plots, sharding, train

    logging.set_verbosity(logging.INFO)  # "resuming after stage" to stderr
    workdir, model_dir, tok_dir = sys.argv[1:4]
    hang_at = int(os.environ.get("HANG_AT", "0"))
    calls = []
    plot_run = plots.plot_run

    def plot_then_maybe_hang(*args, **kwargs):
      plot_run(*args, **kwargs)
      calls.append(1)
      if len(calls) == hang_at:
        pathlib.Path(workdir, "HANGING").write_text("")
        time.sleep(3600)

    plots.plot_run = plot_then_maybe_hang
    config = e2e.tiny_train_config(model_dir, tok_dir)
    mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
    train.train_and_evaluate(config, workdir, mesh, progress=False)
""")


def _driver(tmp_path) -> pathlib.Path:
  path = tmp_path / "driver.py"
  path.write_text(_DRIVER.format(tests=str(_TESTS)))
  return path


def _run(driver, workdir, model, hang_at=0, timeout=900):
  env = dict(os.environ, HANG_AT=str(hang_at))
  return subprocess.Popen(
      [sys.executable, str(driver), str(workdir), *model],
      env=env,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
  )


def test_kill_mid_stage_then_rerun_matches_an_unbroken_run(
    tmp_path, tiny_model
):
  driver = _driver(tmp_path)
  whole, broken = tmp_path / "whole", tmp_path / "broken"
  ref = _run(driver, whole, tiny_model)
  assert ref.wait(timeout=900) == 0, ref.stderr.read()[-3000:]

  # Commits: 1 = stage 0 (the starting team), 2 = stage 1, 3 = stage 2.
  proc = _run(driver, broken, tiny_model, hang_at=3)
  deadline = time.time() + 900
  while not (broken / "HANGING").exists():
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.time() < deadline
    time.sleep(0.5)
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  rows = metrics_lib.read_metrics(broken / "metrics.jsonl")
  assert any(r["step"] == 2 for r in rows)  # the unfinished stage's rows
  steps = checkpoint_lib.TeamCheckpointer(broken / "checkpoints").all_steps()
  assert 2 not in steps and 0 in steps

  again = _run(driver, broken, tiny_model)
  assert again.wait(timeout=900) == 0, again.stderr.read()[-3000:]
  assert "resuming after stage" in again.stderr.read()

  assert e2e.comparable_rows(broken) == e2e.comparable_rows(whole)
  config = e2e.tiny_train_config(*tiny_model)
  params_b, cursor_b = e2e.final_params(broken, config)
  params_w, cursor_w = e2e.final_params(whole, config)
  # Wall times differ between the two runs; the broken run's counts both
  # of its processes.
  assert cursor_b.pop("wall_s") > 0 and cursor_w.pop("wall_s") > 0
  assert cursor_b == cursor_w == {"stage": 2, "num_stages": 2}
  for a, b in zip(jax.tree.leaves(params_b), jax.tree.leaves(params_w)):
    np.testing.assert_array_equal(a, b)
  assert json.loads((broken / "summary.json").read_text())["accuracy"] == (
      json.loads((whole / "summary.json").read_text())["accuracy"]
  )


def test_truncation_keeps_complete_steps_and_rebuilds_tensorboard(tmp_path):
  rows = [
      {"step": 0, "kind": "eval", "avg@2": 0.25},
      {"step": 1, "kind": "stage", "reward": 0.5, "time_stage_s": 3.0},
      {"step": 2, "kind": "stage", "reward": 0.75},
  ]
  writer = metrics_lib.MetricsWriter(tmp_path, enabled=True)
  for r in rows:
    writer.write(
        r["step"],
        {k: v for k, v in r.items() if k not in ("step", "kind")},
        kind=r["kind"],
    )
  writer.close()
  kept = train._truncate_metrics(tmp_path, 1)  # pylint: disable=protected-access
  assert kept == rows[:2]
  assert metrics_lib.read_metrics(tmp_path / "metrics.jsonl") == rows[:2]
  tb = metrics_lib.read_tensorboard_scalars(tmp_path / "tensorboard")
  assert tb == {
      "eval/avg_2": [(0, 0.25)],  # TensorBoard tags have no "@"
      "stage/reward": [(1, 0.5)],
      "stage/time_stage_s": [(1, 3.0)],
  }
  # The resumed run's writer opens at once (the same second, the same
  # default file name): the rebuilt history stays beside its new rows.
  writer = metrics_lib.MetricsWriter(tmp_path, enabled=True)
  writer.write(2, {"reward": 0.5}, kind="stage")
  writer.close()
  tb = metrics_lib.read_tensorboard_scalars(tmp_path / "tensorboard")
  assert sorted(tb["stage/reward"]) == [(1, 0.5), (2, 0.5)]
  assert tb["eval/avg_2"] == [(0, 0.25)]
  assert train._truncate_metrics(tmp_path, None) == []  # pylint: disable=protected-access
  assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_a_run_saved_before_new_config_fields_still_resumes():
  sys.path.insert(0, str(_TESTS.parent / "experiments"))
  import demo  # pylint: disable=g-import-not-at-top

  config = config_lib.from_dict(demo.get_config())
  current = config_lib.to_dict(config)
  # config.json of a run started before `rollout.mesh` and
  # `mesh.num_devices` existed: they compare at their defaults.
  saved = json.loads(json.dumps(current))
  del saved["rollout"]["mesh"], saved["mesh"]["num_devices"]
  train._check_resumable(saved, current)  # pylint: disable=protected-access
  # A real change still refuses the workdir, and so does a config.json
  # that no longer parses (compared as saved).
  saved["rollout"]["group_size"] = 2
  with pytest.raises(
      ValueError, match=r"differs from this config in \['rollout'\]"
  ):
    train._check_resumable(saved, current)  # pylint: disable=protected-access
  saved["rollout"]["group_size"] = 1
  # (unparsed, the missing fields count as differences too)
  with pytest.raises(ValueError, match=r"\['mesh', 'rollout'\]"):
    train._check_resumable(saved, current)  # pylint: disable=protected-access


def test_stage_rows_flag_an_accepted_update_outside_its_region():
  steps = (
      {"agent": 1, "accepted": True, "kl_quantile": 0.04, "tries": 1},
      {"agent": 0, "accepted": False, "kl_quantile": 0.9, "tries": 3},
  )
  record = stage_lib.StageRecord((1, 0), steps, None, 0.5)
  result = train.team_lib.RolloutResult(
      None, (), {"rollout_s": 2.0, "accuracy": 0.5, "reward_mean": 0.5}
  )
  row, agents = train._stage_rows(record, [result, result], [0.05, 0.05])  # pylint: disable=protected-access
  assert row["inside_trust_region"] and row["accepted"] == 1
  assert row["max_kl_quantile"] == 0.04 and row["updates"] == 2
  assert row["time_rollout_s"] == 4.0 and row["rollouts"] == 2
  assert row["rollout_accuracy"] == 0.5 and "rollout_reward_mean" not in row
  assert agents[1]["delta"] == 0.05 and "agent" not in agents[1]
  # Only accepted updates count: agent 0's rejected KL 0.9 is not checked.
  row, _ = train._stage_rows(record, [result], [0.01, 0.05])  # pylint: disable=protected-access
  assert row["inside_trust_region"]
  row, _ = train._stage_rows(record, [result], [0.05, 0.03])  # pylint: disable=protected-access
  assert not row["inside_trust_region"]


def test_stage_rows_without_a_trust_region_report_no_kl():
  steps = (
      {"agent": 0, "accepted": True, "tries": 1},  # delta = inf: unmonitored
      {"agent": 1, "accepted": True, "kl_quantile": 0.02, "tries": 1},
  )
  record = stage_lib.StageRecord((0, 1), steps, None, 0.5)
  result = train.team_lib.RolloutResult(None, (), {"rollout_s": 1.0})
  inf = float("inf")
  row, _ = train._stage_rows(record, [result], [inf, 0.05])  # pylint: disable=protected-access
  assert row["inside_trust_region"] and row["max_kl_quantile"] == 0.02
  row, _ = train._stage_rows(record, [result], [inf, 0.01])  # pylint: disable=protected-access
  assert not row["inside_trust_region"]
  record = stage_lib.StageRecord((0,), steps[:1], None, 0.5)
  row, _ = train._stage_rows(record, [result], [inf])  # pylint: disable=protected-access
  assert row["inside_trust_region"] and "max_kl_quantile" not in row
