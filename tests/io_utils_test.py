"""Tests of the atomic writers and the JSON-lines reader."""

import json

import pytest

from sat_jax import io_utils
from sat_jax.tasks import base


def test_read_jsonl_reports_file_and_line(tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text('{"a": 1}\n\n{"a": 2\n')
  with pytest.raises(
      io_utils.DataFileError, match=r"data.jsonl:3: malformed JSON"
  ):
    io_utils.read_jsonl(path)


def test_read_jsonl_missing_field_and_empty(tmp_path):
  path = tmp_path / "d.jsonl"
  path.write_text('{"a": 1}\n{"b": 2}\n')
  with pytest.raises(
      io_utils.DataFileError, match=r"d.jsonl:2: missing field\(s\) \['a'\]"
  ):
    io_utils.read_jsonl(path, required=["a"])
  path.write_text("\n\n")
  with pytest.raises(io_utils.DataFileError, match="empty file"):
    io_utils.read_jsonl(path)
  with pytest.raises(io_utils.DataFileError, match="no such file"):
    io_utils.read_jsonl(tmp_path / "nope.jsonl")


def test_atomic_write_replaces_whole_file(tmp_path):
  path = tmp_path / "sub" / "x.json"
  io_utils.atomic_write_json(path, {"k": [1, 2]})
  io_utils.atomic_write_json(path, {"k": 3})
  assert json.loads(path.read_text()) == {"k": 3}
  assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp left


def test_append_jsonl_appends_whole_lines(tmp_path):
  path = tmp_path / "m.jsonl"
  for i in range(3):
    io_utils.append_jsonl(path, {"i": i})
  assert [r["i"] for r in io_utils.read_jsonl(path)] == [0, 1, 2]


def test_majority_ties_go_to_earliest():
  assert base.majority(["b", "a", "a", "b"]) == 0
  assert base.majority(["c", "a", "a", "b"]) == 1
  with pytest.raises(ValueError):
    base.majority([])


def test_atomic_write_uses_umask_mode(tmp_path):
  import os  # pylint: disable=g-import-not-at-top

  old = os.umask(0o022)
  try:
    io_utils.atomic_write_text(tmp_path / "f.txt", "x")
  finally:
    os.umask(old)
  assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o644
