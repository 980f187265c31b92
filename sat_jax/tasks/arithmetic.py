"""Multi-digit arithmetic with a short column-wise worked answer.

Problems are drawn, split and stored by `synthetic.SampledTask`.

Worked-answer format (what `demonstration` writes and a tiny model learns):

  457+168 ->  7+8+0=15        452-168 ->  12-8-0=4       457*12 ->  457*2=914
              5+6+1=12                    15-6-1=8                  457*10=4570
              4+1+1=6                     4-1-1=2                   Answer: 5484
              Answer: 625                 Answer: 284

Addition: one line per column from the right, `a+b+carry_in=sum`. Subtraction
(the generator keeps a >= b): `a-b-borrow_in=d`, where a is shown with 10
added when the column borrows. Multiplication: one partial product per digit
of the second operand. The answer is read strictly from the last line of the
form `Answer: <integer>`.
"""

import random
import re
from typing import Any, Hashable, Sequence

from sat_jax.tasks import base
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic

_ANSWER_RE = re.compile(r"^[ \t]*Answer:[ \t]*(-?\d+)[ \t]*$", re.MULTILINE)


def extract_integer_answer(text: str) -> str | None:
  """The integer on the last line that is exactly `Answer: <integer>`."""
  matches = _ANSWER_RE.findall(text)
  return matches[-1] if matches else None


def _digits_lsb(x: int, width: int) -> list[int]:
  return [(x // 10**i) % 10 for i in range(width)]


def worked_sum(a: int, b: int) -> list[str]:
  """Column lines `a_i+b_i+c_i=s_i` from the right; c_{i+1} = s_i // 10."""
  width = max(len(str(a)), len(str(b)))
  lines, carry = [], 0
  for x, y in zip(_digits_lsb(a, width), _digits_lsb(b, width)):
    s = x + y + carry
    lines.append(f"{x}+{y}+{carry}={s}")
    carry = s // 10
  return lines


def worked_difference(a: int, b: int) -> list[str]:
  """Column lines `(a_i + 10 w_i)-b_i-w_in=d_i` for a >= b; w = borrow."""
  if a < b:
    raise ValueError(f"worked_difference needs a >= b, got {a} - {b}")
  width = len(str(a))
  lines, borrow = [], 0
  for x, y in zip(_digits_lsb(a, width), _digits_lsb(b, width)):
    out_borrow = 1 if x - y - borrow < 0 else 0
    top = x + 10 * out_borrow
    lines.append(f"{top}-{y}-{borrow}={top - y - borrow}")
    borrow = out_borrow
  return lines


def worked_product(a: int, b: int) -> list[str]:
  """One partial product a * (b_i 10^i) per digit of b, from the right."""
  return [
      f"{a}*{d * 10**i}={a * d * 10**i}"
      for i, d in enumerate(_digits_lsb(b, len(str(b))))
  ]


_OPS = {
    "+": (lambda a, b: a + b, worked_sum),
    "-": (lambda a, b: a - b, worked_difference),
    "*": (lambda a, b: a * b, worked_product),
}

_COMMUTATIVE = frozenset("+*")


@registry.register("arithmetic")
class ArithmeticTask(synthetic.SampledTask):
  """`a op b` with both operands of exactly `digits` digits (0-9 for 1).

  Difficulty: `digits` and the allowed `operations` ("+", "-", "*"). For "-"
  the larger operand comes first, so answers are never negative.
  Reward: 1 for the exact integer, else 0.
  """

  name = "arithmetic"
  system_prompt = (
      "Work column by column from the right, one line per step, then end with"
      " the line 'Answer: <number>'."
  )

  def __init__(
      self, *, digits: int = 3, operations: Sequence[str] = ("+",), **kwargs
  ):
    synthetic.check_int("arithmetic", "digits", digits, 1, 18)
    operations = tuple(operations)
    if not operations or any(op not in _OPS for op in operations):
      raise ValueError(
          "arithmetic: operations must be a non-empty subset of"
          f" {sorted(_OPS)}, got {operations!r}"
      )
    self.digits = digits
    self.operations = operations
    super().__init__(**kwargs)

  def generator_config(self) -> dict[str, Any]:
    # The config keys the stored data. Version 2 keys + and * order-free,
    # which moved problems between the splits: data stored by version 1 (no
    # "version") must not be read back as if it were split the new way.
    return {
        "digits": self.digits,
        "operations": list(self.operations),
        "version": 2,
    }

  def _draw(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
    lo = 0 if self.digits == 1 else 10 ** (self.digits - 1)
    hi = 10**self.digits - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    op = rng.choice(self.operations)
    if op == "-" and a < b:
      a, b = b, a
    # a+b and b+a are one problem (the same answer from the same operands):
    # were they keyed apart, one could land in train and the other in test.
    # So the key that splits, dedupes and names them is order-free; the
    # prompt keeps the drawn order.
    x, y = (min(a, b), max(a, b)) if op in _COMMUTATIVE else (a, b)
    key = f"{x}{op}{y}"
    record = {
        "prompt": f"Compute {a}{op}{b}.",
        "target": str(_OPS[op][0](a, b)),
        "meta": {"a": a, "b": b, "op": op},
    }
    return key, record

  def extract_answer(self, text: str) -> str | None:
    return extract_integer_answer(text)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    if int(answer) == int(example.target):
      return base.Verdict(1.0, True, answer)
    return base.Verdict(0.0, False, answer, f"{answer} != {example.target}")

  def answer_key(self, answer: str) -> Hashable:
    try:
      return int(answer)
    except ValueError:
      return super().answer_key(answer)

  def demonstration(self, example: base.Example) -> str:
    a, b, op = example.meta["a"], example.meta["b"], example.meta["op"]
    lines = _OPS[op][1](a, b)
    return "\n".join(lines + [f"Answer: {example.target}"])
