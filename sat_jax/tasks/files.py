"""Local benchmark files: finding them, and reading JSON with clear errors.

Every error is an `io_utils.DataFileError` whose message names the file and,
where there is one, the line or the item.
"""

import os
import pathlib
from typing import Any, Sequence

from sat_jax import io_utils
from sat_jax.io_utils import DataFileError


def benchmark_path(
    path: str | os.PathLike | None, task: str, sub: str
) -> pathlib.Path:
  """The data file: `path` (a file, or a folder: its test.jsonl) or the
  default $SAT_JAX_BENCHMARKS/`sub`/test.jsonl."""
  if path is None:
    root = os.environ.get("SAT_JAX_BENCHMARKS")
    if not root:
      raise ValueError(
          f"{task}: give path= (a .jsonl file or its folder) or set"
          " $SAT_JAX_BENCHMARKS"
      )
    path = pathlib.Path(root) / sub
  path = pathlib.Path(path)
  return path / "test.jsonl" if path.is_dir() or not path.suffix else path


def find_file(path: str | os.PathLike, relative: Sequence[str]) -> pathlib.Path:
  """`path` itself if it is a file, else the first `path/<relative>` found."""
  path = pathlib.Path(path).expanduser()
  if path.is_file():
    return path
  for rel in relative:
    if (path / rel).is_file():
      return path / rel
  raise DataFileError(f"{path}: no such file (also tried {list(relative)})")


def read_json_list(path: pathlib.Path) -> list[Any]:
  """The items of a JSON file holding a non-empty list."""
  data = io_utils.read_json(path)
  if not isinstance(data, list):
    raise DataFileError(f"{path}: expected a JSON list of items")
  if not data:
    raise DataFileError(f"{path}: empty file (no items)")
  return data


def require_fields(item: Any, fields: Sequence[str], where: str) -> None:
  """Raises unless `item` is an object holding every one of `fields`."""
  if not isinstance(item, dict):
    raise DataFileError(
        f"{where}: expected an object, got {type(item).__name__}"
    )
  missing = [f for f in fields if f not in item]
  if missing:
    raise DataFileError(f"{where}: missing field(s) {missing}")
