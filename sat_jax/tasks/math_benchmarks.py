"""MATH-500 and AIME 2024/2025 from local files, scored by the last \\boxed{}.

The answer is the argument of the last `\\boxed{...}` / `\\fbox{...}` (nested
braces, `\\boxed 5`), as in the MATH grader. MATH-500 answers are compared
with `math-verify` (`verify(gold, prediction)`: the order matters, gold
first). AIME answers are integers (AIME24 stores them zero-padded, "025"):
the boxed text is read as an integer, directly or through math-verify when
it is an integer-valued expression, and compared as an integer.

math-verify bounds its parsing and comparison time with `signal.alarm`,
which only works in the main thread; elsewhere we call it without timeouts
(a pathological answer can then take long, but cannot crash the run).
Loaders take a path (a .jsonl file or a folder holding test.jsonl); without
one they look under $SAT_JAX_BENCHMARKS (math500/, aime24/, aime25/).
"""

import functools
import os
import re
import threading
from typing import Any, Hashable

from absl import logging
import math_verify
import sympy

from sat_jax import io_utils
from sat_jax.tasks import base
from sat_jax.tasks import files
from sat_jax.tasks import registry

MATH_TIMEOUT_S = 5
INSTRUCTION = (
    "Please reason step by step, and put your final answer within \\boxed{}."
)
_MATH_TYPES = (sympy.Basic, sympy.MatrixBase)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def last_boxed(text: str) -> str | None:
  """Argument of the last `\\boxed`/`\\fbox` in `text`, or None.

  `\\boxed{...}` takes the brace-balanced group (None when it never closes);
  `\\boxed 5` takes the token up to the next space or `$`. An empty box is
  no answer.
  """
  matches = list(_BOX_RE.finditer(text))
  if not matches:
    return None
  rest = text[matches[-1].end() :]
  stripped = rest.lstrip()
  if stripped.startswith("{"):
    depth = 0
    for i, ch in enumerate(stripped):
      depth += {"{": 1, "}": -1}.get(ch, 0)
      if depth == 0:
        content = stripped[1:i].strip()
        return content or None
    return None
  if not rest[:1].isspace():
    return None
  token = re.match(r"[^\s$]+", stripped)
  return token.group(0) if token else None


def _timeout() -> int | None:
  if threading.current_thread() is threading.main_thread():
    return MATH_TIMEOUT_S
  return None


def _parse(latex: str) -> list[Any]:
  return math_verify.parse(latex, parsing_timeout=_timeout())


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple[Any, ...]:
  parsed = tuple(_parse(f"${gold}$"))
  if parsed and not any(isinstance(g, _MATH_TYPES) for g in parsed):
    # math-verify then compares strings only: worth knowing, not an error.
    logging.warning("gold %r is not LaTeX math: string match only", gold)
  return parsed


def math_equal(gold: str, answer: str) -> bool:
  """math-verify equivalence of a boxed answer with a LaTeX gold answer."""
  gold_parsed = _parse_gold(gold)
  if not gold_parsed:
    raise ValueError(f"math-verify cannot parse the gold answer {gold!r}")
  pred = _parse(f"\\boxed{{{answer}}}")
  if not pred:
    return False
  return math_verify.verify(list(gold_parsed), pred, timeout_seconds=_timeout())


# A thousands separator: a comma, LaTeX's {,}, a thin space or a space between a
# digit and a group of exactly three digits ("1,000", "1{,}000", "1\\,000").
_THOUSANDS = re.compile(r"(?<=\d)\s*(?:,|\{,\}|\\[,!;: ]| )\s*(?=\d{3}(?!\d))")
_LATEX_SPACE = re.compile(r"\\[,!;: ]")


def integer_value(answer: str) -> int | None:
  """The integer an answer states ("025", "1,000", "\\text{25}", "50/2").

  Read as math-verify and MathArena read a boxed AIME answer: of an
  equation ("m+n=25") the right-hand side; a whole decimal ("25.0") or a
  percent sign counts; commas and thin spaces join digits only as
  thousands separators, so "2, 5" is a list, not 25.
  """
  plain = re.sub(r"\\text\{([^{}]*)\}|\\mathrm\{([^{}]*)\}", r"\1\2", answer)
  plain = _THOUSANDS.sub("", plain.split("=")[-1])
  plain = _LATEX_SPACE.sub(" ", plain).replace("$", "").strip()
  plain = re.sub(r"\\?%$", "", plain).strip()
  whole = re.fullmatch(r"([+-]?\d+)(?:\.0+)?", plain)
  if whole:
    return int(whole[1])
  parsed = _parse(f"\\boxed{{{plain}}}")
  value = parsed[0] if parsed else None
  if isinstance(value, sympy.Basic) and value.is_number:
    if getattr(value, "is_integer", False):
      return int(value)
    if isinstance(value, sympy.Float) and value == int(value):
      return int(value)
  return None


class _BoxedMathTask(base.Task):
  """A test-only benchmark of problems with a boxed final answer."""

  subdir = ""
  uid_field = ""

  def __init__(self, path: str | os.PathLike | None = None):
    self.path = files.benchmark_path(path, self.name, self.subdir)

  def _validate(self, row: dict[str, Any], where: str) -> None:
    del row, where

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    rows = io_utils.read_jsonl(
        self.path, required=(self.uid_field, "problem", "answer")
    )
    examples = []
    for lineno, row in enumerate(rows, start=1):
      self._validate(row, f"{self.path}: record {lineno}")
      examples.append(
          base.Example(
              uid=f"{self.name}/{row[self.uid_field]}",
              prompt=f"{row['problem']}\n\n{INSTRUCTION}",
              target=str(row["answer"]),
              meta={k: row[k] for k in ("level", "subject") if k in row},
          )
      )
    return examples

  def extract_answer(self, text: str) -> str | None:
    return last_boxed(text)


@registry.register("math500")
class Math500Task(_BoxedMathTask):
  """MATH-500 (prm800k test split): math-verify equivalence with `answer`."""

  name = "math500"
  subdir = "math500"
  uid_field = "unique_id"

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    if math_equal(example.target, answer):
      return base.Verdict(1.0, True, answer)
    return base.Verdict(
        0.0, False, answer, f"not equivalent to {example.target!r}"
    )

  def answer_key(self, answer: str) -> Hashable:
    parsed = _parse(f"\\boxed{{{answer}}}")
    if parsed:
      value = parsed[0]
      # "x=5" votes with "5", as math-verify scores it against a gold 5.
      if isinstance(value, sympy.Eq):
        value = value.rhs
      return str(value)
    logging.debug("math500: vote key of unparsable answer %r", answer)
    return super().answer_key(answer)


class _AimeTask(_BoxedMathTask):
  """AIME: the boxed integer equals the integer answer."""

  uid_field = "id"

  def _validate(self, row: dict[str, Any], where: str) -> None:
    if not re.fullmatch(r"\d+", str(row["answer"]).strip()):
      raise io_utils.DataFileError(
          f"{where}: AIME answer must be an integer, got {row['answer']!r}"
      )

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    value = integer_value(answer)
    if value is None:
      return base.Verdict(0.0, False, answer, "not an integer")
    if value == int(example.target):
      return base.Verdict(1.0, True, answer)
    return base.Verdict(0.0, False, answer, f"{value} != {int(example.target)}")

  def answer_key(self, answer: str) -> Hashable:
    value = integer_value(answer)
    return value if value is not None else super().answer_key(answer)


@registry.register("aime24")
class Aime24Task(_AimeTask):
  name = "aime24"
  subdir = "aime24"


@registry.register("aime25")
class Aime25Task(_AimeTask):
  name = "aime25"
  subdir = "aime25"
