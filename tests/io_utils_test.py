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


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_atomic_write_json_refuses_non_finite_numbers(tmp_path, bad):
  path = tmp_path / "x.json"
  io_utils.atomic_write_json(path, {"k": 1})
  with pytest.raises(ValueError, match=rf"\['a'\]\[1\]\['b'\] is {bad}"):
    io_utils.atomic_write_json(path, {"a": [0, {"b": bad}]})
  with pytest.raises(ValueError, match=rf"the value is {bad}"):
    io_utils.atomic_write_json(path, bad)
  # The old file stands, and no temporary file is left.
  assert path.read_text() == '{\n  "k": 1\n}\n'
  assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
  # A caller for which inf is a valid value asks for it.
  io_utils.atomic_write_json(path, {"d": float("inf")}, allow_nan=True)
  assert path.read_text() == '{\n  "d": Infinity\n}\n'
  assert io_utils.read_json(path) == {"d": float("inf")}


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


def test_atomic_write_reads_the_umask_without_setting_it(tmp_path, monkeypatch):
  # Setting the umask to read it is process-wide: files other threads make
  # meanwhile would come out 0666. On Linux it is read from /proc instead.
  import os  # pylint: disable=g-import-not-at-top

  if not os.path.exists("/proc/self/status"):
    pytest.skip("no /proc: the umask is read once at import instead")
  old = os.umask(0o027)
  real_umask = os.umask

  def no_setting(mask):
    raise AssertionError(f"os.umask({mask:o}) called during a write")

  monkeypatch.setattr(os, "umask", no_setting)
  try:
    io_utils.atomic_write_text(tmp_path / "f.txt", "x")
  finally:
    monkeypatch.setattr(os, "umask", real_umask)
    os.umask(old)
  assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640


def test_read_json_names_the_file(tmp_path):
  path = tmp_path / "config.json"
  path.write_text('{"team": [1, 2],}')
  with pytest.raises(
      io_utils.DataFileError, match="config.json:1: malformed JSON"
  ):
    io_utils.read_json(path)
  with pytest.raises(io_utils.DataFileError, match="nope.json: no such file"):
    io_utils.read_json(tmp_path / "nope.json")
  path.write_text('{"a": [1]}')
  assert io_utils.read_json(path) == {"a": [1]}


def test_local_path_refuses_urls_and_makes_paths_absolute(
    tmp_path, monkeypatch
):
  with pytest.raises(ValueError, match="workdir 'gs://bucket/run' is a URL"):
    io_utils.local_path("gs://bucket/run", "workdir")
  monkeypatch.chdir(tmp_path)
  assert io_utils.local_path("runs/a", "workdir") == tmp_path / "runs" / "a"
