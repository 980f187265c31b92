"""The shared base of seeded synthetic tasks: parameters, splits, storage.

A synthetic task (arithmetic, countdown, zebra, blocksworld, guess_number,
twenty_questions) turns its difficulty parameters and a seed into records,
deterministically. Every problem goes to train or test by
`datasets.hash_split` of its canonical key, so the splits never overlap. The
splits are written once as a TFDS array_record dataset under
`data_dir/<name>/<hash of the parameters>/` and read back with grain;
`load` turns each stored record into an `Example`.

`SyntheticTask` owns the parameters, storage and loading; a subclass says
how records are made (`records`). `SampledTask` makes them by drawing
problems from a seeded RNG until each split has its size.
"""

import abc
import os
import pathlib
import random
from typing import Any

from sat_jax.tasks import base
from sat_jax.tasks import datasets

SPLITS = ("train", "test")
# Draws allowed per requested problem, plus a floor, before the problem space
# is declared too small (duplicates and the other split's problems are drawn
# and skipped).
_DRAWS_PER_PROBLEM = 200
_MIN_DRAWS = 2000


def default_data_dir() -> pathlib.Path:
  """$SAT_JAX_DATA_DIR, else ~/.cache/sat_jax/tasks."""
  env = os.environ.get("SAT_JAX_DATA_DIR")
  return pathlib.Path(env or "~/.cache/sat_jax/tasks").expanduser()


def check_int(
    task: str, field: str, value: Any, lo: int, hi: int | None = None
) -> None:
  """Raises a ValueError naming `field` unless `value` is an int in [lo, hi].

  A float or string would otherwise pass a range check (or fail one with a
  bare TypeError) and break later, far from the argument that caused it; a
  bool is refused as it is not a count.
  """
  ok = isinstance(value, int) and not isinstance(value, bool)
  if ok and value >= lo and (hi is None or value <= hi):
    return
  wanted = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
  raise ValueError(f"{task}: {field} must be an int {wanted}, got {value!r}")


class SyntheticTask(base.Task, abc.ABC):
  """Seeded, stored, hash-split problems of one generator configuration.

  Subclasses set `name` and implement `generator_config()` (the difficulty
  parameters that change the records: they key the stored data) and
  `records(split, count)`; `_example(record)` maps a stored record to an
  `Example` (by default its "prompt", "target" and "meta" fields).
  """

  def __init__(
      self,
      *,
      seed: int = 0,
      train_size: int = 1000,
      test_size: int = 200,
      test_fraction: float = 0.2,
      data_dir: str | os.PathLike | None = None,
  ):
    check_int(self.name, "train_size", train_size, 0)
    check_int(self.name, "test_size", test_size, 0)
    if not 0.0 < test_fraction < 1.0:
      raise ValueError(
          f"{self.name}: test_fraction must be in (0, 1), got {test_fraction}"
      )
    self.seed = int(seed)
    self.split_sizes = {"train": train_size, "test": test_size}
    self.test_fraction = float(test_fraction)
    self.data_dir = pathlib.Path(data_dir or default_data_dir()).expanduser()
    self._builder = None

  @abc.abstractmethod
  def generator_config(self) -> dict[str, Any]:
    """The parameters that determine the records (with the seed)."""

  @abc.abstractmethod
  def records(self, split: str, count: int) -> list[dict[str, Any]]:
    """`count` distinct records of `split`, each with a unique "uid"."""

  def _example(self, record: dict[str, Any]) -> base.Example:
    return base.Example(
        record["uid"],
        record["prompt"],
        record["target"],
        record.get("meta", {}),
    )

  def load(self, split: str) -> list[base.Example]:
    base.check_split(split, SPLITS)
    if self._builder is None:
      config = {
          **self.generator_config(),
          "seed": self.seed,
          "test_fraction": self.test_fraction,
      }
      self._builder = datasets.prepare(
          self.name, self.records, self.split_sizes, self.data_dir, config
      )
    return [
        self._example(r) for r in datasets.load_records(self._builder, split)
    ]


class SampledTask(SyntheticTask):
  """A synthetic task whose problems are drawn at random.

  Subclasses implement `_draw(rng) -> (key, drawn)`, where `key` is the
  canonical problem (equal keys are the same problem). A candidate whose key
  is new and belongs to the split being made becomes a record through
  `_record(key, drawn)` (by default `drawn` itself, a dict without "uid"),
  so expensive work such as solving belongs there; either hook returns None
  to reject a draw.
  """

  @abc.abstractmethod
  def _draw(self, rng: random.Random) -> tuple[str, Any] | None:
    """One random candidate problem: (canonical key, data), or None."""

  def _record(self, key: str, drawn: Any) -> dict[str, Any] | None:
    del key
    return drawn

  def _uid(self, key: str, index: int) -> str:
    """The uid of the `index`-th (1-based) record of a split."""
    del index
    return f"{self.name}/{key}"

  def records(self, split: str, count: int) -> list[dict[str, Any]]:
    rng = random.Random(f"{self.name}/{self.seed}/{split}")
    out, seen, draws = [], set(), 0
    budget = _DRAWS_PER_PROBLEM * count + _MIN_DRAWS
    while len(out) < count:
      draws += 1
      if draws > budget:
        raise ValueError(
            f"{self.name}: found only {len(out)} distinct {split} problems of"
            f" the {count} asked ({split}_size) with"
            f" {self.generator_config()}; lower {split}_size or widen the"
            " generator's parameters"
        )
      candidate = self._draw(rng)
      if candidate is None:
        continue
      key, drawn = candidate
      if key in seen or datasets.hash_split(key, self.test_fraction) != split:
        continue
      record = self._record(key, drawn)
      if record is None:
        continue
      seen.add(key)
      out.append({"uid": self._uid(key, len(out) + 1), **record})
    return out
