"""Synthetic task data as TFDS array_record datasets, read with grain.

A synthetic task is a seeded generator of JSON-able records. `prepare` writes
the splits once as a TFDS dataset (array_record, no TensorFlow needed) under a
directory keyed by the generator's parameters, and `load_records` reads a split
back through `data_source` and grain. `tfds.load` is never used: it needs
TensorFlow.

Train and test never overlap: `hash_split` assigns every problem to a split by
a hash of its canonical key, so the same problem cannot land in both.
"""

import hashlib
import json
import pathlib
from typing import Any, Callable, Iterable, Iterator, Mapping

import grain
import tensorflow_datasets as tfds

# (split, count) -> records; each record is a dict with a unique "uid".
RecordsFn = Callable[[str, int], Iterable[dict[str, Any]]]


def hash_split(key: str, test_fraction: float) -> str:
  """ "test" for a deterministic `test_fraction` of keys, else "train"."""
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
  digest = hashlib.sha256(key.encode("utf-8")).digest()
  bucket = int.from_bytes(digest[:8], "big") / 2.0**64
  return "test" if bucket < test_fraction else "train"


def config_key(config: Mapping[str, Any]) -> str:
  """A short stable hash of a generator's parameters (its data directory)."""
  blob = json.dumps(dict(config), sort_keys=True, default=str)
  return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


class SyntheticTaskData(
    tfds.core.GeneratorBasedBuilder, skip_registration=True
):
  """A TFDS builder over a records function; each record stored as JSON."""

  VERSION = tfds.core.Version("1.0.0")

  def __init__(
      self, *, records_fn: RecordsFn, split_sizes: Mapping[str, int], **kwargs
  ):
    self._records_fn = records_fn
    self._split_sizes = dict(split_sizes)
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict(
            {"uid": tfds.features.Text(), "record": tfds.features.Text()}
        ),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Synthetic: nothing to download.
    return {
        split: self._generate_examples(split, n)
        for split, n in self._split_sizes.items()
    }

  def _generate_examples(self, split: str, count: int) -> Iterator[tuple]:
    seen: set[str] = set()
    for record in self._records_fn(split, count):
      uid = record["uid"]
      if uid in seen:
        raise ValueError(f"records_fn yielded uid {uid!r} twice in {split}")
      seen.add(uid)
      yield uid, {"uid": uid, "record": json.dumps(record, sort_keys=True)}


def prepare(
    name: str,
    records_fn: RecordsFn,
    split_sizes: Mapping[str, int],
    data_dir: str | pathlib.Path,
    config: Mapping[str, Any],
) -> SyntheticTaskData:
  """Builds (once) and returns the dataset of task `name` with `config`.

  The data lives in `data_dir/name/<hash of config and split sizes>/`; a call
  with the same arguments reuses it.
  """
  key = config_key({"config": dict(config), "splits": dict(split_sizes)})
  builder = SyntheticTaskData(
      records_fn=records_fn,
      split_sizes=split_sizes,
      data_dir=str(pathlib.Path(data_dir) / name / key),
      file_format="array_record",
  )
  builder.download_and_prepare()
  return builder


def load_records(
    builder: SyntheticTaskData, split: str
) -> list[dict[str, Any]]:
  """All records of `split`, in stored order, decoded from JSON via grain."""
  if split not in builder.info.splits:
    raise ValueError(
        f"unknown split {split!r}; available: {sorted(builder.info.splits)}"
    )
  source = builder.as_data_source(split=split)
  dataset = grain.MapDataset.source(source).map(
      lambda row: json.loads(row["record"])
  )
  return list(dataset)
