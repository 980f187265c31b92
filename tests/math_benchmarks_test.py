"""Tests of MATH-500 / AIME loading and scoring, on fixtures and real data."""

import json
import re

import pytest
import sympy

from sat_jax import io_utils
from sat_jax.tasks import base
from sat_jax.tasks import math_benchmarks as mb
from sat_jax.tasks import registry


@pytest.mark.parametrize(
    "text,want",
    [
        (r"so \boxed{\frac{1}{2}} done", r"\frac{1}{2}"),
        (
            r"\boxed{1} then $\boxed{\left( 3, \frac{\pi}{2} \right)}$.",
            r"\left( 3, \frac{\pi}{2} \right)",
        ),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"$\boxed 5$.", "5"),
        (r"\boxed {4}", "4"),
        (r"\fbox{7}", "7"),
        (r"\boxed{a} and \fbox{b}", "b"),
        (r"\boxed{\boxed{5}}", "5"),
        (r"\boxed{12", None),  # never closed: no answer
        (r"\boxed{ }", None),
        (r"\boxedx{3}", None),
        ("no box, 42", None),
    ],
)
def test_last_boxed(text, want):
  assert mb.last_boxed(text) == want


def test_math_equivalence_by_hand():
  same = [
      (r"\frac{1}{2}", "0.5"),
      (r"\frac{1}{2}", r"\dfrac{1}{2}"),
      (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\pi/2)"),
      (r"10,\!080", "10080"),
      (r"\text{Evelyn}", r"\text{Evelyn}"),
      ("3, 5, 7", "7,5,3"),
      (r"2\sqrt{2}", r"\sqrt{8}"),
  ]
  for gold, answer in same:
    assert mb.math_equal(gold, answer), (gold, answer)
  different = [
      (r"\frac{1}{2}", "0.6"),
      ("(3,4]", "(3,4)"),
      (r"\text{Evelyn}", r"\text{Navin}"),
      ("3, 5, 7", "3, 5"),
      (r"2\sqrt{2}", r"\sqrt{2}"),
  ]
  for gold, answer in different:
    assert not mb.math_equal(gold, answer), (gold, answer)


def test_aime_integers():
  for text, value in [
      ("025", 25),
      ("25", 25),
      (r"\text{25}", 25),
      ("1,000", 1000),
      ("1{,}000", 1000),
      (r"1\,000", 1000),
      ("12,345,678", 12345678),
      (r"\frac{50}{2}", 25),
      # As math-verify and MathArena: an equation's right-hand side, a
      # whole decimal and a percent sign count ...
      ("m+n=25", 25),
      ("x = 25", 25),
      ("25.0", 25),
      (r"25\%", 25),
      # ... and a comma joins digits only as a thousands separator.
      ("2, 5", None),
      ("0, 25", None),
      ("1,00", None),
      ("25.5", None),
      ("x", None),
  ]:
    assert mb.integer_value(text) == value, text


def _write(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_loaders_and_scoring_on_fixtures(tmp_path):
  math_file = _write(
      tmp_path / "m.jsonl",
      [
          {
              "problem": "1/2 = ?",
              "answer": r"\frac{1}{2}",
              "unique_id": "t/1",
              "subject": "Algebra",
              "level": 1,
          },
      ],
  )
  (ex,) = registry.get_task("math500", path=math_file).load("test")
  assert ex.uid == "math500/t/1" and ex.target == r"\frac{1}{2}"
  assert ex.prompt.startswith("1/2 = ?") and r"\boxed{}" in ex.prompt
  task = mb.Math500Task(math_file)
  assert base.score_text(task, ex, r"It is $\boxed{0.5}$.").correct
  assert not base.score_text(task, ex, r"It is $\boxed{0.6}$.").correct
  assert task.answer_key("0.5") != task.answer_key("0.6")
  assert task.answer_key(r"\frac{1}{2}") == task.answer_key(r"\dfrac{1}{2}")
  assert task.answer_key("x=5") == task.answer_key("5")  # as scored
  assert task.answer_key("x=5") != task.answer_key("x=6")
  # A folder with test.jsonl works as the path.
  aime_dir = tmp_path / "aime24"
  aime_dir.mkdir()
  _write(aime_dir / "test.jsonl", [{"id": 60, "problem": "p", "answer": "025"}])
  aime = mb.Aime24Task(aime_dir)
  (ex,) = aime.load("test")
  for text, ok in [
      (r"\boxed{25}", True),
      (r"\boxed{025}", True),
      (r"\boxed{26}", False),
      (r"\boxed{x}", False),
  ]:
    assert base.score_text(aime, ex, text).correct == ok, text
  assert aime.answer_key("025") == aime.answer_key("25") == 25
  with pytest.raises(ValueError, match="unknown split"):
    aime.load("train")


def test_bad_files(tmp_path, monkeypatch):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"id": 1, "problem": "p", "answer": "1"}\n{"id": 2,\n')
  with pytest.raises(io_utils.DataFileError, match=r"bad.jsonl:2: malformed"):
    mb.Aime25Task(bad).load()
  _write(bad, [{"id": 1, "problem": "p"}])
  with pytest.raises(
      io_utils.DataFileError, match=r"bad.jsonl:1: missing.*answer"
  ):
    mb.Aime25Task(bad).load()
  bad.write_text("\n")
  with pytest.raises(io_utils.DataFileError, match="empty file"):
    mb.Math500Task(bad).load()
  _write(bad, [{"id": 1, "problem": "p", "answer": "1/2"}])
  with pytest.raises(io_utils.DataFileError, match="must be an integer"):
    mb.Aime24Task(bad).load()
  with pytest.raises(io_utils.DataFileError, match="no such file"):
    mb.Math500Task(tmp_path / "missing.jsonl").load()
  monkeypatch.delenv("SAT_JAX_BENCHMARKS", raising=False)
  with pytest.raises(ValueError, match="SAT_JAX_BENCHMARKS"):
    mb.Math500Task()
  monkeypatch.setenv("SAT_JAX_BENCHMARKS", str(tmp_path))
  assert mb.Aime24Task().path == tmp_path / "aime24" / "test.jsonl"


def test_unparsable_gold_is_a_logged_wrong_verdict():
  task = mb.Math500Task("unused.jsonl")
  ex = base.Example("math500/x", "", r"\text{}")
  v = base.score_text(task, ex, r"\boxed{1}")
  assert not v.correct and "cannot parse the gold" in v.reason
  assert v.reason.startswith("verifier error")


# -------------------------------------------------- real data (benchdata)


def _shifted(obj):
  """A value that differs from `obj` by construction (first entry + 1)."""
  if isinstance(obj, sympy.MatrixBase):
    m = sympy.Matrix(obj)
    m[0, 0] += 1
    return m
  if isinstance(obj, sympy.Eq):
    return sympy.Eq(obj.lhs, _shifted(obj.rhs), evaluate=False)
  if isinstance(obj, sympy.Tuple):
    return sympy.Tuple(_shifted(obj[0]), *obj[1:])
  if isinstance(obj, sympy.FiniteSet):
    return sympy.FiniteSet(*(_shifted(e) for e in obj))
  if isinstance(obj, sympy.Interval):
    return sympy.Interval(
        _shifted(obj.start), _shifted(obj.end), obj.left_open, obj.right_open
    )
  if isinstance(obj, sympy.Union):
    return sympy.Union(*(_shifted(a) for a in obj.args), evaluate=False)
  if isinstance(obj, sympy.Expr):
    return obj + 1
  raise TypeError(f"no wrong variant for {type(obj).__name__}")


def _wrong_variant(gold: str) -> str:
  """Plainly wrong LaTeX: another choice letter or word for text answers,
  else the gold value with its first entry plus one, written by sympy."""
  choice = re.fullmatch(r"\\text\{\(([A-E])\)\}", gold)
  if choice:
    return r"\text{(%s)}" % "BCDEA"["ABCDE".index(choice.group(1))]
  if gold.startswith(r"\text{"):
    return r"\text{nobody}"
  return sympy.latex(_shifted(mb._parse_gold(gold)[0]))


def _rates(task, examples, wrong_fn):
  """(gold rate, wrongly-accepted rate, failing golds, accepted wrongs)."""
  gold_fail, wrong_pass = [], []
  for ex in examples:
    gold, wrong = ex.target, wrong_fn(ex.target)
    assert mb._parse(f"\\boxed{{{wrong}}}"), (ex.uid, wrong)  # a real answer
    right_text = (
        f"A first attempt gave $\\boxed{{{wrong}}}$, but after checking,"
        f" the final answer is $\\boxed{{{gold}}}$. I hope it is correct."
    )
    wrong_text = (
        f"At first $\\boxed{{{gold}}}$ seemed right, but the final answer"
        f" is $\\boxed{{{wrong}}}$."
    )
    if not base.score_text(task, ex, right_text).correct:
      gold_fail.append((ex.uid, gold))
    if base.score_text(task, ex, wrong_text).correct:
      wrong_pass.append((ex.uid, gold, wrong))
  n = len(examples)
  return 1 - len(gold_fail) / n, len(wrong_pass) / n, gold_fail, wrong_pass


@pytest.mark.benchdata
def test_math500_gold_correct_and_wrong_variants_rejected(shared_benchmarks):
  task = mb.Math500Task(shared_benchmarks / "math500")
  examples = task.load("test")
  assert len(examples) == 500
  gold_rate, wrong_rate, gold_fail, wrong_pass = _rates(
      task, examples, _wrong_variant
  )
  print(f"MATH-500: gold {gold_rate:.1%}, wrong accepted {wrong_rate:.1%}")
  assert gold_fail == [] and wrong_pass == []


@pytest.mark.benchdata
@pytest.mark.parametrize("name", ["aime24", "aime25"])
def test_aime_gold_correct_and_wrong_variants_rejected(shared_benchmarks, name):
  task = registry.get_task(name, path=shared_benchmarks / name)
  examples = task.load("test")
  assert len(examples) == 30
  plus_one = lambda gold: str(int(gold) + 1)
  for gold_form in (str, lambda g: str(int(g))):  # as stored, and unpadded
    shown = [
        base.Example(e.uid, e.prompt, gold_form(e.target)) for e in examples
    ]
    gold_rate, wrong_rate, gold_fail, wrong_pass = _rates(task, shown, plus_one)
    print(f"{name}: gold {gold_rate:.1%}, wrong accepted {wrong_rate:.1%}")
    assert gold_fail == [] and wrong_pass == []
