"""Tests of the TFDS/grain storage of synthetic task records."""

import pytest

from sat_jax.tasks import datasets


def _records(split, count):
  # Problems are integers; the split of each is decided by its hash.
  out, i = [], 0
  while len(out) < count:
    if datasets.hash_split(f"p{i}", 0.3) == split:
      out.append({"uid": f"p{i}", "value": i * i})
    i += 1
  return out


def test_round_trip_and_disjoint_splits(tmp_path):
  builder = datasets.prepare(
      "squares", _records, {"train": 20, "test": 6}, tmp_path, {"seed": 0}
  )
  train = datasets.load_records(builder, "train")
  test = datasets.load_records(builder, "test")
  assert len(train) == 20 and len(test) == 6
  assert all(r["value"] == int(r["uid"][1:]) ** 2 for r in train + test)
  assert not {r["uid"] for r in train} & {r["uid"] for r in test}
  with pytest.raises(ValueError, match="unknown split 'dev'"):
    datasets.load_records(builder, "dev")


def test_hash_split_is_deterministic_and_near_fraction():
  keys = [f"k{i}" for i in range(4000)]
  first = [datasets.hash_split(k, 0.25) for k in keys]
  assert first == [datasets.hash_split(k, 0.25) for k in keys]
  assert 0.22 < first.count("test") / len(keys) < 0.28
  with pytest.raises(ValueError, match="test_fraction"):
    datasets.hash_split("x", 1.0)


def test_duplicate_uid_is_an_error(tmp_path):
  def dup(split, count):
    del split
    return [{"uid": "same"} for _ in range(count)]

  with pytest.raises(Exception, match="twice"):
    datasets.prepare("dup", dup, {"train": 2}, tmp_path, {})
