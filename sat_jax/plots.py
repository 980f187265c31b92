"""The run plot: held-out team accuracy and certificate terms per stage."""

import io
import pathlib
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

from sat_jax import io_utils

CERT_TERMS = ("gain", "shift", "bias", "finite_sample", "lower_bound")


def _series(rows, kind: str, key: str) -> tuple[list[int], list[float]]:
  points = [(r["step"], r[key]) for r in rows if r["kind"] == kind and key in r]
  return [p[0] for p in points], [p[1] for p in points]


def accuracy_key(rows: Sequence[dict[str, Any]]) -> str | None:
  """The avg@K key of the eval rows (K is the run's eval.k)."""
  for r in rows:
    if r["kind"] == "eval":
      for key in r:
        if key.startswith("avg@"):
          return key
  return None


def plot_run(
    rows: Sequence[dict[str, Any]],
    path: str | pathlib.Path,
    title: str = "",
    num_agents: int = 0,
) -> None:
  """Writes the PNG (atomically) from metrics.jsonl rows.

  Left: held-out team avg@K (and each agent's own answer, for agents that
  ever gave a correct one: in a split relay only the last speaker answers)
  before training (stage 0) and after each stage, with the stage's
  training reward. Right:
  the stage certificate's terms (episodic variant, reward units).
  """
  fig, (ax_acc, ax_cert) = plt.subplots(1, 2, figsize=(11, 4))
  acc = accuracy_key(rows)
  if acc is not None:
    ax_acc.plot(*_series(rows, "eval", acc), "o-", lw=2, label=f"team {acc}")
    for a in range(num_agents):
      steps, values = _series(rows, "eval", f"agent{a}/{acc}")
      if steps and any(values):
        ax_acc.plot(steps, values, ".--", alpha=0.6, label=f"agent {a} {acc}")
  steps, reward = _series(rows, "stage", "reward")
  if steps:
    ax_acc.plot(steps, reward, "s:", color="gray", label="train reward")
  ax_acc.set_xlabel("stage")
  ax_acc.set_ylabel("accuracy / reward")
  ax_acc.set_ylim(-0.02, 1.02)
  if ax_acc.get_legend_handles_labels()[0]:
    ax_acc.legend(fontsize=8)
  ax_acc.set_title("held-out team accuracy")
  for term in CERT_TERMS:
    steps, values = _series(rows, "stage", f"cert_{term}")
    if steps:
      style = "k-" if term == "lower_bound" else ".-"
      ax_cert.plot(steps, values, style, label=term)
  ax_cert.axhline(0.0, color="gray", lw=0.5)
  ax_cert.set_xlabel("stage")
  ax_cert.set_ylabel("reward units")
  ax_cert.set_title("stage certificate terms")
  if ax_cert.get_legend_handles_labels()[0]:
    ax_cert.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  io_utils.atomic_write_bytes(path, buf.getvalue())
