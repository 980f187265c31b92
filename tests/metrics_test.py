"""Tests of the metrics writer: JSON lines and TensorBoard events agree."""

import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax import io_utils
from sat_jax import metrics


def test_rows_reach_jsonl_and_tensorboard(tmp_path):
  writer = metrics.MetricsWriter(tmp_path, enabled=True)
  writer.write(0, {"reward": jnp.float32(0.25), "accepted": np.bool_(True)})
  writer.write(1, {"reward": 0.75, "note": "x"}, kind="stage")
  writer.write(1, {"kl": 0.01}, kind="agent0")
  writer.write_config({"seed": 3})
  writer.close()
  rows = metrics.read_metrics(tmp_path / "metrics.jsonl", kind="stage")
  assert [(r["step"], r["reward"]) for r in rows] == [(0, 0.25), (1, 0.75)]
  assert rows[0]["accepted"] is True
  tb = metrics.read_tensorboard_scalars(tmp_path / "tensorboard")
  assert tb["stage/reward"] == [(0, 0.25), (1, 0.75)]
  assert tb["stage/accepted"] == [(0, 1.0)]
  assert tb["agent0/kl"] == [(1, pytest.approx(0.01))]
  assert (tmp_path / "config.json").read_text().strip().startswith("{")


def test_nan_stops_with_where(tmp_path):
  writer = metrics.MetricsWriter(tmp_path, enabled=True)
  with pytest.raises(FloatingPointError, match="step 4.*'loss'"):
    writer.write(4, {"loss": float("nan")})
  assert not (tmp_path / "metrics.jsonl").exists()


def test_non_scalar_metric_is_an_error(tmp_path):
  writer = metrics.MetricsWriter(tmp_path, enabled=True)
  with pytest.raises(ValueError, match="'v' is not a scalar"):
    writer.write(0, {"v": np.zeros(3)})


def test_disabled_writer_writes_nothing(tmp_path):
  writer = metrics.MetricsWriter(tmp_path / "w", enabled=False)
  writer.write(0, {"a": 1.0})
  assert not (tmp_path / "w").exists()


def test_config_with_no_trust_region_is_saved(tmp_path):
  # delta = inf (no trust region) is a valid setting, unlike a metric.
  writer = metrics.MetricsWriter(tmp_path, enabled=True)
  writer.write_config({"sat": {"delta": float("inf")}, "seed": 3})
  writer.close()
  saved = io_utils.read_json(tmp_path / "config.json")
  assert saved == {"sat": {"delta": float("inf")}, "seed": 3}
