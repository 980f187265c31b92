"""Tests of the synthetic math tasks: arithmetic and countdown."""

import fractions
import itertools

import pytest

from sat_jax.tasks import arithmetic
from sat_jax.tasks import base
from sat_jax.tasks import countdown
from sat_jax.tasks import datasets
from sat_jax.tasks import registry


def _example(a, b, op):
  target = {"+": a + b, "-": a - b, "*": a * b}[op]
  return base.Example(
      f"t/{a}{op}{b}", "", str(target), {"a": a, "b": b, "op": op}
  )


# ------------------------------------------------------------- arithmetic


def test_worked_answers_by_hand():
  task = arithmetic.ArithmeticTask(data_dir="unused")
  assert task.demonstration(_example(457, 168, "+")) == (
      "7+8+0=15\n5+6+1=12\n4+1+1=6\nAnswer: 625"
  )
  assert task.demonstration(_example(957, 168, "+")) == (
      "7+8+0=15\n5+6+1=12\n9+1+1=11\nAnswer: 1125"
  )
  assert task.demonstration(_example(452, 168, "-")) == (
      "12-8-0=4\n15-6-1=8\n4-1-1=2\nAnswer: 284"
  )
  assert task.demonstration(_example(457, 12, "*")) == (
      "457*2=914\n457*10=4570\nAnswer: 5484"
  )


def test_worked_answers_are_consistent_exhaustively_for_two_digits():
  # Every column line is true arithmetic and the digits compose the answer.
  for a, b in itertools.product(range(10, 100), repeat=2):
    carry, digits = 0, []
    for line in arithmetic.worked_sum(a, b):
      lhs, s = line.split("=")
      x, y, c = map(int, lhs.split("+"))
      assert c == carry and x + y + c == int(s)
      digits.append(int(s) % 10)
      carry = int(s) // 10
    assert int(str(carry) + "".join(map(str, reversed(digits)))) == a + b
    if a >= b:
      got = [int(l.split("=")[1]) for l in arithmetic.worked_difference(a, b)]
      assert int("".join(map(str, reversed(got)))) == a - b


def test_extraction_is_strict():
  ex = arithmetic.extract_integer_answer
  assert ex("7+8+0=15\nAnswer: 625") == "625"
  assert ex("Answer: 1\nAnswer: 2\n") == "2"  # the last one counts
  assert ex("  Answer:  -3  ") == "-3"
  assert ex("Answer: 625.") is None
  assert ex("The answer: 625") is None
  assert ex("Answer: 6 25") is None
  assert ex("625") is None


def test_scoring_and_vote_keys():
  task = arithmetic.ArithmeticTask(data_dir="unused")
  ex = _example(457, 168, "+")
  assert base.score_text(task, ex, "Answer: 625").correct
  assert base.score_text(task, ex, "Answer: 0625").correct
  wrong = base.score_text(task, ex, "Answer: 624")
  assert not wrong.correct and wrong.reward == 0.0 and "625" in wrong.reason
  none = base.score_text(task, ex, "six hundred")
  assert none.answer is None and none.reason == "no answer found"
  assert task.answer_key("0625") == task.answer_key("625") == 625


def test_generated_splits_are_disjoint_graded_and_deterministic(tmp_path):
  task = registry.get_task(
      "arithmetic",
      digits=3,
      operations=("+", "-", "*"),
      seed=1,
      train_size=300,
      test_size=60,
      data_dir=tmp_path,
  )
  train, test = task.load("train"), task.load("test")
  assert len(train) == 300 and len(test) == 60
  assert not {e.uid for e in train} & {e.uid for e in test}
  for e in train + test:
    a, b, op = e.meta["a"], e.meta["b"], e.meta["op"]
    assert 100 <= a <= 999 and 100 <= b <= 999
    assert e.prompt == f"Compute {a}{op}{b}."
    assert base.score_text(task, e, task.demonstration(e)).correct
  assert {e.meta["op"] for e in train} == {"+", "-", "*"}
  assert all(int(e.target) >= 0 for e in train if e.meta["op"] == "-")
  same = arithmetic.ArithmeticTask(
      digits=3,
      operations=("+", "-", "*"),
      seed=1,
      train_size=300,
      test_size=60,
      data_dir=tmp_path / "other",
  )
  assert sorted(e.uid for e in same.load("test")) == sorted(e.uid for e in test)
  other = arithmetic.ArithmeticTask(
      digits=3,
      operations=("+", "-", "*"),
      seed=2,
      train_size=300,
      test_size=60,
      data_dir=tmp_path,
  )
  assert {e.uid for e in other.load("test")} != {e.uid for e in test}


def test_bad_parameters_and_exhausted_space(tmp_path):
  with pytest.raises(ValueError, match="digits"):
    arithmetic.ArithmeticTask(digits=0)
  with pytest.raises(ValueError, match="operations"):
    arithmetic.ArithmeticTask(operations=("/",))
  with pytest.raises(ValueError, match="test_fraction"):
    arithmetic.ArithmeticTask(test_fraction=1.0)
  # One-digit sums: 55 problems in all (a+b and b+a are one), about 11 of
  # them in test.
  task = arithmetic.ArithmeticTask(
      digits=1, train_size=10, test_size=50, data_dir=tmp_path
  )
  with pytest.raises(ValueError, match="distinct test problems"):
    task.load("test")
  with pytest.raises(ValueError, match="unknown split"):
    task.load("dev")


class _FixedRng:
  """Draws the given operands and operation, in order."""

  def __init__(self, a, b, op):
    self.ints, self.op = iter((a, b)), op

  def randint(self, lo, hi):
    del lo, hi
    return next(self.ints)

  def choice(self, seq):
    assert self.op in seq
    return self.op


def test_commutative_problems_are_keyed_order_free():
  task = arithmetic.ArithmeticTask(
      digits=2, operations=("+", "-", "*"), data_dir="unused"
  )
  drawn = {
      (77, 49, "+"): ("49+77", "Compute 77+49.", "126"),
      (49, 77, "+"): ("49+77", "Compute 49+77.", "126"),
      (63, 14, "*"): ("14*63", "Compute 63*14.", "882"),
      (49, 77, "-"): ("77-49", "Compute 77-49.", "28"),  # a >= b: not commuted
  }
  for (a, b, op), (key, prompt, target) in drawn.items():
    got_key, record = task._draw(_FixedRng(a, b, op))
    assert (got_key, record["prompt"], record["target"]) == (
        key,
        prompt,
        target,
    )
    assert task._uid(got_key, 1) == f"arithmetic/{key}"


@pytest.mark.parametrize("ops", [("+",), ("*",), ("+", "-", "*")])
def test_no_test_problem_is_in_train_commuted(ops):
  # The demo's size. Keyed by the drawn order, 27 of the 200 two-digit sums
  # in test had their commuted form in train.
  task = arithmetic.ArithmeticTask(
      digits=2, operations=ops, train_size=2000, test_size=200,
      data_dir="unused",
  )  # fmt: skip

  def forms(records):
    out = []
    for r in records:
      a, b, op = r["meta"]["a"], r["meta"]["b"], r["meta"]["op"]
      assert r["prompt"] == f"Compute {a}{op}{b}."
      out.append((min(a, b), op, max(a, b)) if op in "+*" else (a, op, b))
    return out

  train = forms(task.records("train", 2000))
  test = forms(task.records("test", 200))
  assert not set(train) & set(test)
  # Nor is b+a a second copy of a+b within a split.
  assert (len(set(train)), len(set(test))) == (2000, 200)


def test_data_stored_under_the_old_split_is_not_read_back(tmp_path):
  # Data stored before the order-free key, under the config it was keyed
  # by then; loading must make the new split, not return these records.
  stale_config = {
      "digits": 2, "operations": ["+"], "seed": 0, "test_fraction": 0.2,
  }  # fmt: skip
  sizes = {"train": 3, "test": 2}

  def stale(split, count):
    return [
        {"uid": f"stale-{split}-{i}", "prompt": "old", "target": "0"}
        for i in range(count)
    ]

  datasets.prepare("arithmetic", stale, sizes, tmp_path, stale_config)
  task = arithmetic.ArithmeticTask(
      digits=2, train_size=3, test_size=2, data_dir=tmp_path
  )
  for split, count in sizes.items():
    uids = [e.uid for e in task.load(split)]
    assert uids == [r["uid"] for r in task.records(split, count)]


# -------------------------------------------------------------- countdown


def test_safe_evaluator_by_hand():
  ev = countdown.evaluate_expression
  assert ev("(3+5)*2-4") == (12, [3, 5, 2, 4])
  assert ev("8/(3-8/3)") == (24, [8, 3, 8, 3])  # exact fractions
  assert ev("7/2") == (fractions.Fraction(7, 2), [7, 2])
  assert ev("6×4÷2") == (12, [6, 4, 2])
  assert ev(" (10 + 0) * 2 ") == (20, [10, 0, 2])
  for bad in [
      "__import__('os').system('true')",
      "2**10",
      "-3+5",
      "3.5*2",
      "True+1",
      "x+1",
      "abs(3)",
      "(1,2)",
      "1_0+3",
      "0x10-3",
      "0o7*2",
      "0b11+1",
      "1+" * 200 + "1",
  ]:
    with pytest.raises(countdown.ExpressionError):
      ev(bad)
  with pytest.raises(countdown.ExpressionError, match="division by zero"):
    ev("5/(3-3)")


def test_countdown_verdicts_by_hand():
  task = countdown.CountdownTask(data_dir="unused")
  ex = base.Example("c", "", {"numbers": [3, 3, 8, 8], "target": 24})
  assert base.score_text(task, ex, "Answer: 8/(3-8/3)").correct
  assert base.score_text(task, ex, "Answer: 8/(3-8/3) = 24").correct
  cases = {
      "Answer: 8*3": "must use",  # not all numbers
      "Answer: 8*3+8-8+3-3": "must use",  # 3 and 8 used three times
      "Answer: 8+8+3+3": "evaluates to 22",
      "Answer: 8/(3-3)+8*3": "division by zero",
      "Answer: import os": "invalid expression",
  }
  for text, reason in cases.items():
    v = base.score_text(task, ex, text)
    assert not v.correct and reason in v.reason, (text, v)
  subset = countdown.CountdownTask(use_all=False, data_dir="unused")
  assert base.score_text(subset, ex, "Answer: 8*3").correct
  assert not base.score_text(subset, ex, "Answer: 8*3*1").correct
  # Equivalent expressions are one vote; a different value is another.
  assert task.answer_key("8/(3-8/3)") == task.answer_key("8 / (3 - 8/3)")
  assert task.answer_key("(8+8)+(3+3)") == task.answer_key("3+3+8+8")
  assert task.answer_key("8*3") != task.answer_key("8+3+3+8")


def test_countdown_generation(tmp_path):
  task = registry.get_task(
      "countdown",
      num_numbers=4,
      max_number=12,
      max_target=50,
      seed=0,
      train_size=120,
      test_size=30,
      data_dir=tmp_path,
  )
  train, test = task.load("train"), task.load("test")
  assert len(train) == 120 and len(test) == 30
  assert not {e.uid for e in train} & {e.uid for e in test}
  for e in train + test:
    nums, target = e.target["numbers"], e.target["target"]
    assert len(nums) == 4 and all(1 <= n <= 12 for n in nums)
    assert 1 <= target <= 50
    assert e.prompt.startswith(f"Use {', '.join(map(str, nums))} to make")
    # The demonstration is a solution: every step true, final answer valid.
    demo = task.demonstration(e)
    for line in demo.splitlines()[:-1]:
      lhs, rhs = line.split("=")
      assert countdown.evaluate_expression(lhs)[0] == int(rhs)
    assert base.score_text(task, e, demo).correct, demo
  with pytest.raises(ValueError, match="num_numbers"):
    countdown.CountdownTask(num_numbers=1)
