"""ZebraLogic (grid mode) and AutoLogi loaders for their published formats.

ZebraLogic records (HF `allenai/ZebraLogicBench-private`, grid_mode; .jsonl,
.json list or .parquet): `id`, `size` ("3*4"), `puzzle` (text), `solution`
`{"header": ["House", ...], "rows": [["1", ...], ...]}`. Scored as in
ZeroEval (`zebra_grid.GridScoring`): puzzle accuracy is the reward, cell
accuracy an extra score. The public ZebraLogicBench masks every cell as
"___": such files are refused.

AutoLogi records (`testing-data/AutoLogi_{en,cn}.jsonl`): `idx`, `prompt`,
`lang`, `code{Inputs_Check_code, Constraint_List_code, Traverse_code}`. The
first two define `inputs_check(inputs)` and `constraint_list` (functions of
the inputs). The answer is extracted as the official evaluator does (last
fenced code block, else the last `{...}`, else the last `[...]`; `//`
comments dropped, true/false mapped; `ast.literal_eval`, then the text after
a first "=", then JSON) and is correct iff `inputs_check` and every
constraint hold. The dataset's code runs in a separate Python process (`-I`,
CPU and memory limits, a timeout: 20 s as upstream), never in-process; an
error or timeout scores the answer wrong, with the reason logged.
"""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any, Hashable

from absl import logging

from sat_jax import io_utils
from sat_jax.tasks import base
from sat_jax.tasks import files
from sat_jax.tasks import registry
from sat_jax.tasks import zebra_grid

AUTOLOGI_TIMEOUT_S = 20.0
_MEMORY_LIMIT_BYTES = 2 << 30
_MASKED_CELL = "___"


def _read_records(path: pathlib.Path, required: tuple[str, ...]) -> list[dict]:
  """Rows of a .jsonl, .json (list of objects) or .parquet file."""
  if path.suffix == ".jsonl":
    return io_utils.read_jsonl(path, required=required)
  if not path.is_file():
    raise io_utils.DataFileError(f"{path}: no such file")
  if path.suffix == ".parquet":
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

    rows = pq.read_table(path).to_pylist()
  elif path.suffix == ".json":
    rows = files.read_json_list(path)
  else:
    raise io_utils.DataFileError(
        f"{path}: unknown format (expected .jsonl, .json or .parquet)"
    )
  if not rows:
    raise io_utils.DataFileError(f"{path}: empty file (no records)")
  for i, row in enumerate(rows, start=1):
    files.require_fields(row, required, f"{path}: record {i}")
  return rows


def _check_solution(solution: Any, where: str) -> dict[str, list]:
  if not isinstance(solution, dict) or not {"header", "rows"} <= set(solution):
    raise io_utils.DataFileError(f"{where}: solution needs 'header' and 'rows'")
  header = list(solution["header"])
  rows = [[str(c) for c in row] for row in solution["rows"]]
  if not header or header[0] != "House":
    raise io_utils.DataFileError(f"{where}: header must start with 'House'")
  if not rows or any(len(r) != len(header) for r in rows):
    raise io_utils.DataFileError(
        f"{where}: every row needs {len(header)} cells"
    )
  if any(c == _MASKED_CELL for r in rows for c in r[1:]):
    raise io_utils.DataFileError(
        f"{where}: solution cells are masked ({_MASKED_CELL!r}): this is the"
        " public ZebraLogicBench; use the grid_mode file with gold solutions"
    )
  return {"header": header, "rows": rows}


@registry.register("zebralogic")
class ZebraLogicTask(zebra_grid.GridScoring, base.Task):
  """ZebraLogic grid mode from a local file (test split only)."""

  name = "zebralogic"

  def __init__(self, path: str | os.PathLike | None = None):
    self.path = files.benchmark_path(path, self.name, "zebralogic")

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    rows = _read_records(self.path, ("id", "size", "puzzle", "solution"))
    examples = []
    for i, row in enumerate(rows, start=1):
      table = _check_solution(row["solution"], f"{self.path}: record {i}")
      prompt = (
          f"{row['puzzle']}\n\nSolve the puzzle. End your answer with JSON"
          f" in this format:\n{zebra_grid.answer_format(table['header'])}"
      )
      examples.append(
          base.Example(
              uid=f"{self.name}/{row['id']}",
              prompt=prompt,
              target=table,
              meta={"size": str(row["size"])},
          )
      )
    return examples


_FENCE_RE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_autologi_answer(text: str) -> str | None:
  """Last fenced code block, else last `{...}`, else last `[...]`."""
  blocks = _FENCE_RE.findall(text)
  if blocks and blocks[-1].strip():
    return blocks[-1].strip()
  braces = zebra_grid.last_balanced(text, "{", "}")
  return braces or zebra_grid.last_balanced(text, "[", "]")


def parse_autologi_answer(answer: str) -> Any:
  """The Python literal of an extracted answer; ValueError if it has none."""
  cleaned = re.sub(r"//.*?(\n|$)", r"\1", answer)
  cleaned = cleaned.replace("true", "True").replace("false", "False")
  candidates = [cleaned]
  if "=" in cleaned:
    candidates.append(cleaned.split("=", 1)[1].strip())
  for candidate in candidates:
    try:
      return ast.literal_eval(candidate)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
      pass
  try:
    return json.loads(answer)
  except json.JSONDecodeError as e:
    raise ValueError(f"not a Python/JSON literal: {e.msg}") from e


_RUNNER = """
import ast as _ast, sys as _sys
_inputs = _ast.literal_eval(_sys.stdin.read())
_ok = bool(inputs_check(_inputs)) and all(
    bool(_c(_inputs)) for _c in constraint_list
)
print("SATJAX_RESULT", _ok)
"""


# Set by the child itself (no preexec_fn: unsafe in a threaded parent).
_PRELUDE = """
import resource as _resource
_resource.setrlimit(_resource.RLIMIT_CPU, ({cpu_s}, {cpu_s}))
_resource.setrlimit(_resource.RLIMIT_AS, ({mem}, {mem}))
"""


def run_verifier(
    code: dict[str, str], inputs: Any, timeout_s: float = AUTOLOGI_TIMEOUT_S
) -> tuple[bool, str]:
  """Runs AutoLogi's check code on `inputs` in a child Python: (ok, reason)."""
  prelude = _PRELUDE.format(cpu_s=int(timeout_s) + 1, mem=_MEMORY_LIMIT_BYTES)
  program = "\n".join([
      prelude,
      code["Inputs_Check_code"],
      code["Constraint_List_code"],
      _RUNNER,
  ])
  with tempfile.TemporaryDirectory(prefix="sat_jax_autologi_") as tmp:
    script = pathlib.Path(tmp) / "verify.py"
    script.write_text(program, encoding="utf-8")
    try:
      proc = subprocess.run(
          [sys.executable, "-I", str(script)],
          input=repr(inputs),
          capture_output=True,
          text=True,
          cwd=tmp,
          timeout=timeout_s,
          check=False,
      )
    except subprocess.TimeoutExpired:
      return False, f"verifier timed out after {timeout_s:g} s"
  for line in reversed(proc.stdout.splitlines()):
    if line.startswith("SATJAX_RESULT "):
      ok = line.split()[-1] == "True"
      return ok, "" if ok else "constraints not satisfied"
  tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return False, f"verifier failed (exit {proc.returncode}): {tail}"


@registry.register("autologi")
class AutoLogiTask(base.Task):
  """AutoLogi from a local .jsonl file (test split only)."""

  name = "autologi"

  def __init__(
      self,
      path: str | os.PathLike | None = None,
      timeout_s: float = AUTOLOGI_TIMEOUT_S,
  ):
    self.path = files.benchmark_path(path, self.name, "autologi")
    if not timeout_s > 0:
      raise ValueError(f"autologi: timeout_s must be > 0, got {timeout_s}")
    self.timeout_s = float(timeout_s)

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    rows = _read_records(self.path, ("idx", "prompt", "code"))
    examples = []
    for i, row in enumerate(rows, start=1):
      code = row["code"]
      need = ("Inputs_Check_code", "Constraint_List_code")
      if not isinstance(code, dict) or any(k not in code for k in need):
        raise io_utils.DataFileError(
            f"{self.path}: record {i}: code needs {list(need)}"
        )
      examples.append(
          base.Example(
              uid=f"{self.name}/{row['idx']}",
              prompt=row["prompt"],
              target={k: code[k] for k in need},
              meta={"lang": row.get("lang", "")},
          )
      )
    return examples

  def extract_answer(self, text: str) -> str | None:
    return extract_autologi_answer(text)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    try:
      inputs = parse_autologi_answer(answer)
    except ValueError as e:
      return base.Verdict(0.0, False, answer, str(e))
    ok, reason = run_verifier(example.target, inputs, self.timeout_s)
    if ok:
      return base.Verdict(1.0, True, answer)
    if reason != "constraints not satisfied":
      logging.warning("autologi/%s: %s", example.uid, reason)
    return base.Verdict(0.0, False, answer, reason)

  def answer_key(self, answer: str) -> Hashable:
    try:
      inputs = parse_autologi_answer(answer)
      return json.dumps(inputs, sort_keys=True, default=repr)
    except (ValueError, TypeError):
      return super().answer_key(answer)
