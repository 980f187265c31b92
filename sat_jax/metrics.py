"""Run metrics: JSON lines plus TensorBoard event files (no TensorFlow).

One `MetricsWriter` per run, on process 0 only (other processes get a writer
that drops everything, so every host can call it unconditionally). Each row is
written with a single append (`io_utils.append_jsonl`), so a killed run never
leaves half a line; TensorBoard events go through tensorboardX, which writes
the event protocol buffers itself.
"""

import math
import pathlib
from typing import Any, Mapping

import jax
import numpy as np
from tensorboardX import SummaryWriter

from sat_jax import io_utils

Scalars = Mapping[str, Any]


def to_python_scalars(metrics: Scalars) -> dict[str, float | int | bool | str]:
  """Device or numpy scalars -> Python scalars (fetches once, explicitly)."""
  fetched = jax.device_get(dict(metrics))
  out: dict[str, float | int | bool | str] = {}
  for key, value in fetched.items():
    if isinstance(value, (str, bool, int, float)):
      out[key] = value
      continue
    array = np.asarray(value)
    if array.size != 1:
      raise ValueError(f"metric {key!r} is not a scalar: shape {array.shape}")
    item = array.item()
    out[key] = bool(item) if array.dtype == np.bool_ else item
  return out


def check_finite(metrics: Scalars, where: str) -> None:
  """Raises FloatingPointError naming the metric and `where` on NaN/Inf."""
  for key, value in metrics.items():
    if isinstance(value, float) and not math.isfinite(value):
      raise FloatingPointError(f"{where}: metric {key!r} is {value}")


class MetricsWriter:
  """Writes `metrics.jsonl` and TensorBoard events under `workdir`."""

  def __init__(self, workdir: str | pathlib.Path, enabled: bool | None = None):
    self.enabled = jax.process_index() == 0 if enabled is None else enabled
    self.workdir = pathlib.Path(workdir)
    self.jsonl_path = self.workdir / "metrics.jsonl"
    self._tb = None
    if self.enabled:
      self.workdir.mkdir(parents=True, exist_ok=True)
      self._tb = SummaryWriter(logdir=str(self.workdir / "tensorboard"))

  def write(self, step: int, metrics: Scalars, kind: str = "stage") -> dict:
    """Logs one row; numeric entries also go to TensorBoard as `kind/key`."""
    row = to_python_scalars(metrics)
    check_finite(row, f"{kind} row at step {step}")
    if not self.enabled:
      return row
    io_utils.append_jsonl(self.jsonl_path, {"step": step, "kind": kind, **row})
    for key, value in row.items():
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        self._tb.add_scalar(f"{kind}/{key}", value, global_step=step)
      elif isinstance(value, bool):
        self._tb.add_scalar(f"{kind}/{key}", float(value), global_step=step)
    self._tb.flush()
    return row

  def write_config(self, config: Mapping[str, Any]) -> None:
    """Saves the effective config as `config.json` (atomically)."""
    if self.enabled:
      # delta=inf (no trust region) is a valid setting, saved as Infinity:
      # config.json is read back by Python's json (`train.load_run_config`).
      io_utils.atomic_write_json(
          self.workdir / "config.json", dict(config), allow_nan=True
      )
      self._tb.add_text("config", f"```\n{dict(config)}\n```", global_step=0)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def read_metrics(
    path: str | pathlib.Path, kind: str | None = None
) -> list[dict]:
  """Rows of a `metrics.jsonl` file, optionally only those of one kind."""
  rows = io_utils.read_jsonl(path, required=("step", "kind"))
  return [r for r in rows if kind is None or r["kind"] == kind]


def read_tensorboard_scalars(logdir: str | pathlib.Path) -> dict[str, list]:
  """{tag: [(step, value), ...]} from the event files in `logdir`.

  Parses the TFRecord framing (length, crc, payload, crc) directly, so tests
  can check what TensorBoard would show without TensorFlow installed.
  """
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top

  scalars: dict[str, list] = {}
  for path in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset + 12 <= len(data):
      length = int.from_bytes(data[offset : offset + 8], "little")
      payload = data[offset + 12 : offset + 12 + length]
      offset += 12 + length + 4
      event = event_pb2.Event()
      event.ParseFromString(payload)
      for value in event.summary.value:
        if value.HasField("simple_value"):
          scalars.setdefault(value.tag, []).append(
              (event.step, value.simple_value)
          )
  return scalars
