"""Small file helpers: atomic writes and JSON-lines reading with clear errors."""

import json
import math
import os
import pathlib
import tempfile
from typing import Any, Iterable

PathLike = str | os.PathLike


def _umask_from_proc() -> int | None:
  """The process umask as Linux reports it, without changing it."""
  try:
    status = pathlib.Path("/proc/self/status").read_text()
  except OSError:
    return None
  for line in status.splitlines():
    if line.startswith("Umask:"):
      return int(line.split()[1], 8)
  return None


def _umask_by_setting() -> int:
  umask = os.umask(0)
  os.umask(umask)
  return umask


# Setting the umask to read it is process-wide: a file another thread makes
# meanwhile (orbax's async save) would get mode 0666. So it is read from
# /proc where there is one, and elsewhere set and restored once, here.
_UMASK_AT_IMPORT = _umask_from_proc()
if _UMASK_AT_IMPORT is None:
  _UMASK_AT_IMPORT = _umask_by_setting()


def _umask() -> int:
  current = _umask_from_proc()
  return _UMASK_AT_IMPORT if current is None else current


def local_path(path: PathLike, what: str) -> pathlib.Path:
  """`path` as an absolute local path; a URL (gs://...) is refused.

  Run files are written with local file operations (atomic renames):
  pathlib would turn "gs://b/run" into a local folder "gs:/b/run" and write
  there silently. Multi-host runs use a folder every host mounts (NFS, a
  gcsfuse mount of the bucket).
  """
  if "://" in os.fspath(path):
    raise ValueError(
        f"{what} {os.fspath(path)!r} is a URL: run files are written with"
        " local file operations; give a local folder, or a shared one that"
        " every host mounts (NFS, gcsfuse)"
    )
  return pathlib.Path(path).absolute()


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
  """Writes `data` to `path` so that readers see the old file or the new one.

  The bytes go to a temporary file in the same directory, are fsynced, and the
  file is renamed over `path` (rename is atomic on POSIX).
  """
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    # mkstemp creates 0600 files; give the result the usual umask-based mode.
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def atomic_write_text(path: PathLike, text: str) -> None:
  atomic_write_bytes(path, text.encode("utf-8"))


def _non_finite(obj: Any, where: str = "") -> tuple[str, float] | None:
  """(path, value) of the first NaN/inf float in `obj`, or None."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return where or "the value", obj
  if isinstance(obj, dict):
    items = obj.items()
  elif isinstance(obj, (list, tuple)):
    items = enumerate(obj)
  else:
    return None
  for key, value in items:
    found = _non_finite(value, f"{where}[{key!r}]")
    if found is not None:
      return found
  return None


def atomic_write_json(
    path: PathLike, obj: Any, indent: int | None = 2, *, allow_nan: bool = False
) -> None:
  """Writes `obj` as JSON (sorted keys), atomically.

  NaN and inf are refused (ValueError naming the entry) unless `allow_nan`:
  they are not JSON, and as results they mean something went wrong. A
  caller for which inf is a valid setting passes allow_nan=True (Python's
  json reads it back).
  """
  if not allow_nan:
    found = _non_finite(obj)
    if found is not None:
      raise ValueError(
          f"{path}: {found[0]} is {found[1]}, which is not valid JSON"
      )
  text = json.dumps(obj, indent=indent, sort_keys=True, allow_nan=allow_nan)
  atomic_write_text(path, text + "\n")


def atomic_write_jsonl(path: PathLike, rows: Iterable[Any]) -> None:
  atomic_write_text(
      path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
  )


def append_jsonl(path: PathLike, row: Any) -> None:
  """Appends one JSON line with a single `write` on an O_APPEND descriptor.

  One write call per line means a killed process leaves either the whole line
  or nothing of it (for lines far below the pipe/page size, as metrics are).
  """
  line = (json.dumps(row, sort_keys=True) + "\n").encode("utf-8")
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, line)
  finally:
    os.close(fd)


class DataFileError(ValueError):
  """A data file is missing, empty or malformed; the message names where."""


def read_json(path: PathLike) -> Any:
  """A JSON file's value; DataFileError naming the file if absent or bad."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise DataFileError(f"{path}: no such file")
  try:
    return json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise DataFileError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from e


def read_jsonl(path: PathLike, required: Iterable[str] = ()) -> list[dict]:
  """Reads a JSON-lines file of objects.

  Raises DataFileError naming the file and 1-based line for a missing or empty
  file, a line that is not valid JSON or not an object, or a missing field.
  Blank lines are skipped.
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise DataFileError(f"{path}: no such file")
  required = tuple(required)
  rows = []
  with path.open("r", encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise DataFileError(f"{path}:{lineno}: malformed JSON ({e.msg})") from e
      if not isinstance(row, dict):
        raise DataFileError(
            f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}"
        )
      missing = [k for k in required if k not in row]
      if missing:
        raise DataFileError(f"{path}:{lineno}: missing field(s) {missing}")
      rows.append(row)
  if not rows:
    raise DataFileError(f"{path}: empty file (no JSON lines)")
  return rows
