"""Countdown: combine the given numbers with + - * / to reach a target.

Any expression that uses each given number exactly once (or at most once
with `use_all=False`) and evaluates to the target is correct. Expressions are
evaluated by `evaluate_expression`, a small AST walker over exact fractions
(never `eval`): integer literals, binary + - * /, parentheses; nothing else.

Worked-answer format: one line per step of the generator's solution, then
the whole expression, e.g. for 3 5 7 9 -> 24:

  9+7=16
  5+3=8
  16+8=24
  Answer: (9+7)+(5+3)
"""

import ast
import collections
import fractions
import random
import re
from typing import Any, Hashable

from sat_jax.tasks import base
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic

MAX_EXPRESSION_CHARS = 200
_MAX_TRIES = 10_000  # random combinations tried per drawn problem
_BINOPS = {
    ast.Add: lambda x, y: x + y,
    ast.Sub: lambda x, y: x - y,
    ast.Mult: lambda x, y: x * y,
    ast.Div: lambda x, y: x / y,
}
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


_DECIMAL_RE = re.compile(r"[0-9]+")


class ExpressionError(ValueError):
  """The expression is not a valid countdown expression."""


def evaluate_expression(text: str) -> tuple[fractions.Fraction, list[int]]:
  """Exact value of an arithmetic expression and the integer literals it uses.

  Raises ExpressionError for anything but decimal integer literals (no
  `1_0`, `0x10`), binary + - * /
  and parentheses (names, calls, unary minus, powers, floats), for division
  by zero, and for text longer than MAX_EXPRESSION_CHARS.
  """
  text = text.replace("×", "*").replace("÷", "/").strip()
  if len(text) > MAX_EXPRESSION_CHARS:
    raise ExpressionError(
        f"expression longer than {MAX_EXPRESSION_CHARS} characters"
    )
  try:
    tree = ast.parse(text, mode="eval")
  except SyntaxError as e:
    raise ExpressionError(f"not an expression: {e.msg}") from e
  numbers: list[int] = []

  def walk(node: ast.AST) -> fractions.Fraction:
    if isinstance(node, ast.Constant):
      if type(node.value) is not int:  # bool is an int subclass: excluded.
        raise ExpressionError(f"only integer literals, got {node.value!r}")
      # Python also reads 1_0, 0x10, 0o7 and 0b1 as ints; a countdown number
      # is written in plain decimal digits.
      literal = ast.get_source_segment(text, node)
      if literal is None or not _DECIMAL_RE.fullmatch(literal):
        raise ExpressionError(
            f"only plain decimal integers, got {literal or node.value!r}"
        )
      numbers.append(node.value)
      return fractions.Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
      left, right = walk(node.left), walk(node.right)
      if isinstance(node.op, ast.Div) and right == 0:
        raise ExpressionError("division by zero")
      return _BINOPS[type(node.op)](left, right)
    raise ExpressionError(f"{type(node).__name__} is not allowed")

  return walk(tree.body), numbers


def _render(node: Any, top: bool = True) -> str:
  if isinstance(node, int):
    return str(node)
  op, left, right = node
  s = f"{_render(left, False)}{op}{_render(right, False)}"
  return s if top else f"({s})"


def _apply(op: str, x: int, y: int) -> int | None:
  """x op y when it stays a positive integer (the generator's rule)."""
  if op == "+":
    return x + y
  if op == "-":
    return x - y if x > y else None
  if op == "*":
    return x * y
  return x // y if y > 0 and x % y == 0 else None


_ANSWER_RE = re.compile(r"^[ \t]*Answer:[ \t]*(.+?)[ \t]*$", re.MULTILINE)


@registry.register("countdown")
class CountdownTask(synthetic.SampledTask):
  """Reach `target` from `num_numbers` numbers in [1, max_number].

  Difficulty: `num_numbers` (2-6) and `max_number`. The generator combines
  all numbers in a random order with random operations (intermediate values
  stay positive integers), so every problem is solvable; the target lies in
  [1, max_target]. The verifier accepts any valid expression.
  """

  name = "countdown"
  system_prompt = (
      "Combine the numbers with + - * / and parentheses, one step per line,"
      " then end with the line 'Answer: <expression>'."
  )

  def __init__(
      self,
      *,
      num_numbers: int = 4,
      max_number: int = 20,
      max_target: int = 100,
      use_all: bool = True,
      **kwargs,
  ):
    synthetic.check_int("countdown", "num_numbers", num_numbers, 2, 6)
    synthetic.check_int("countdown", "max_number", max_number, 2)
    synthetic.check_int("countdown", "max_target", max_target, 1)
    self.num_numbers = num_numbers
    self.max_number = max_number
    self.max_target = max_target
    self.use_all = bool(use_all)
    super().__init__(**kwargs)

  def generator_config(self) -> dict[str, Any]:
    return {
        "num_numbers": self.num_numbers,
        "max_number": self.max_number,
        "max_target": self.max_target,
        "use_all": self.use_all,
    }

  def _solve_randomly(self, rng, numbers):
    """Random combination of all numbers: (value, tree, step lines) or None."""
    pool = [(n, n) for n in numbers]
    steps = []
    while len(pool) > 1:
      i, j = rng.sample(range(len(pool)), 2)
      (x, tx), (y, ty) = pool[i], pool[j]
      op = rng.choice("+-*/")
      value = _apply(op, x, y)
      if value is None:
        return None
      steps.append(f"{x}{op}{y}={value}")
      pool = [p for k, p in enumerate(pool) if k not in (i, j)]
      pool.append((value, (op, tx, ty)))
    return pool[0][0], pool[0][1], steps

  def _draw(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
    for _ in range(_MAX_TRIES):
      numbers = [
          rng.randint(1, self.max_number) for _ in range(self.num_numbers)
      ]
      solved = self._solve_randomly(rng, numbers)
      if solved is not None and 1 <= solved[0] <= self.max_target:
        break
    else:
      raise ValueError(
          f"countdown: no target in [1, {self.max_target}] after {_MAX_TRIES}"
          f" tries with {self.generator_config()}; raise max_target"
      )
    target, tree, steps = solved
    numbers = sorted(numbers)
    key = ",".join(map(str, numbers)) + f"->{target}"
    shown = ", ".join(map(str, numbers))
    rule = "each exactly once" if self.use_all else "each at most once"
    record = {
        "prompt": f"Use {shown} to make {target} ({rule}).",
        "target": {"numbers": numbers, "target": target},
        "meta": {"steps": steps, "solution": _render(tree)},
    }
    return key, record

  def extract_answer(self, text: str) -> str | None:
    matches = _ANSWER_RE.findall(text)
    if not matches:
      return None
    # A trailing "= 24" restates the target; the expression is what counts.
    return matches[-1].split("=")[0].strip() or None

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    try:
      value, used = evaluate_expression(answer)
    except ExpressionError as e:
      return base.Verdict(0.0, False, answer, f"invalid expression: {e}")
    given = collections.Counter(example.target["numbers"])
    used_count = collections.Counter(used)
    reason = ""
    if self.use_all and used_count != given:
      reason = f"uses {sorted(used)}, must use {sorted(given.elements())}"
    elif not self.use_all and used_count - given:
      reason = f"uses {sorted(used)}, only {sorted(given.elements())} given"
    elif value != example.target["target"]:
      reason = f"evaluates to {value}, not {example.target['target']}"
    if reason:
      return base.Verdict(0.0, False, answer, reason)
    return base.Verdict(1.0, True, answer)

  def answer_key(self, answer: str) -> Hashable:
    """(value, sorted numbers): all equivalent expressions are one vote."""
    try:
      value, used = evaluate_expression(answer)
    except ExpressionError:
      return super().answer_key(answer)
    return (str(value), tuple(sorted(used)))

  def demonstration(self, example: base.Example) -> str:
    return "\n".join(
        example.meta["steps"] + [f"Answer: {example.meta['solution']}"]
    )
