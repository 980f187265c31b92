"""ZebraLogic grid answers: extraction, parsing and cell grading.

Scoring is ZebraLogic's (ZeroEval grid mode), shared by the synthetic `zebra`
task and the `zebralogic` benchmark: the answer is the last complete JSON
object `{"solution": {"House 1": {col: value, ...}, ...}}`; a cell is correct
when `.lower().strip()` matches; cell accuracy = correct cells / all
non-House cells; the puzzle is correct when every cell is. Reward = puzzle
correctness; cell accuracy is reported through `extra_scores`.
"""

import json
from typing import Any, Hashable, Mapping, Sequence

from sat_jax.tasks import base


def last_balanced(
    text: str, open_ch: str = "{", close_ch: str = "}", strings: bool = False
) -> str | None:
  """The last complete top-level `open_ch ... close_ch` span of `text`.

  With `strings`, brackets inside JSON strings ("...", backslash escapes)
  within a span do not count.
  """
  last, depth, start, in_str, escaped = None, 0, 0, False, False
  for i, ch in enumerate(text):
    if in_str:
      if escaped:
        escaped = False
      elif ch == "\\":
        escaped = True
      elif ch == '"':
        in_str = False
    elif strings and ch == '"' and depth > 0:
      in_str = True
    elif ch == open_ch:
      if depth == 0:
        start = i
      depth += 1
    elif ch == close_ch and depth > 0:
      depth -= 1
      if depth == 0:
        last = text[start : i + 1]
  return last


def last_json_object(text: str) -> str | None:
  """The last complete top-level `{...}` span (braces in strings ignored)."""
  return last_balanced(text, "{", "}", strings=True)


def _cell(value: Any) -> str | None:
  """A predicted cell as compared: a list counts by its first item (as in
  ZeroEval), a number by its digits (ZeroEval raises there), None or empty
  text is no value."""
  if isinstance(value, list):
    value = value[0] if value else None
  if isinstance(value, bool) or value is None:
    return None
  if isinstance(value, (int, float)):
    value = str(value)
  if not isinstance(value, str) or not value.strip():
    return None
  return value.lower().strip()


def parse_grid(answer: str) -> dict[str, Any]:
  """The `solution` object of a JSON answer; ValueError when there is none."""
  try:
    obj = json.loads(answer, strict=False)
  except json.JSONDecodeError as e:
    raise ValueError(f"malformed JSON: {e.msg}") from e
  if not isinstance(obj, dict) or not isinstance(obj.get("solution"), dict):
    raise ValueError("no 'solution' object in the answer")
  return obj["solution"]


def grade_grid(
    solution: Mapping[str, Any], grid: Mapping[str, Any]
) -> tuple[int, int]:
  """(correct cells, total non-House cells) of `grid` against the gold table."""
  header, rows = solution["header"], solution["rows"]
  correct = total = 0
  for i, row in enumerate(rows):
    house = grid.get(f"House {i + 1}")
    for j, column in enumerate(header[1:], start=1):
      total += 1
      got = _cell(house.get(column)) if isinstance(house, dict) else None
      correct += got is not None and got == str(row[j]).lower().strip()
  return correct, total


def answer_format(header: Sequence[str]) -> str:
  """The JSON answer template for the given table header."""
  cells = ", ".join(f'"{c}": "..."' for c in header[1:])
  return f'{{"solution": {{"House 1": {{{cells}}}, ...}}}}'


class GridScoring:
  """Extraction, check, vote key and cell accuracy for grid answers.

  A mixin placed before `base.Task`, for tasks whose `example.target` is a
  `{"header", "rows"}` table.
  """

  def extract_answer(self, text: str) -> str | None:
    return last_json_object(text)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    try:
      correct, total = grade_grid(example.target, parse_grid(answer))
    except ValueError as e:
      return base.Verdict(0.0, False, answer, str(e))
    if correct == total:
      return base.Verdict(1.0, True, answer)
    return base.Verdict(0.0, False, answer, f"{correct}/{total} cells correct")

  def answer_key(self, answer: str) -> Hashable:
    try:
      grid = parse_grid(answer)
    except ValueError:
      return super().answer_key(answer)
    return tuple(
        sorted(
            (str(h), str(c), _cell(v))
            for h, row in grid.items()
            if isinstance(row, dict)
            for c, v in row.items()
        )
    )

  def extra_scores(
      self, example: base.Example, verdict: base.Verdict
  ) -> dict[str, float]:
    """{"cell_accuracy": correct / total cells} (0 without a parsable grid)."""
    if verdict.answer is None:
      return {"cell_accuracy": 0.0}
    try:
      correct, total = grade_grid(example.target, parse_grid(verdict.answer))
    except ValueError:
      return {"cell_accuracy": 0.0}
    return {"cell_accuracy": correct / total}
