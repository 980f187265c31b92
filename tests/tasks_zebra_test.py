"""Tests of the zebra puzzles: solver, generator, ZebraLogic-style checker."""

import itertools
import json
import math
import random

import pytest

from sat_jax.tasks import base
from sat_jax.tasks import registry
from sat_jax.tasks import zebra

C = zebra.Clue
ATTRS_2x2 = {"Name": ["Alice", "Bob"], "Pet": ["cat", "dog"]}
TABLE_3x2 = {
    "header": ["House", "Name", "Drink"],
    "rows": [
        ["1", "Bob", "tea"],
        ["2", "Alice", "milk"],
        ["3", "Carol", "water"],
    ],
}


def _brute_force(houses, attributes, clues):
  """All solutions by enumerating every permutation of every attribute."""
  names = list(attributes)
  out = []
  for perms in itertools.product(
      *(itertools.permutations(range(houses)) for _ in names)
  ):
    house_of = {
        (a, v): perm[i]
        for a, perm in zip(names, perms)
        for i, v in enumerate(attributes[a])
    }
    if all(zebra.holds(c, house_of) for c in clues):
      out.append(house_of)
  return out


def test_clue_relations_by_hand():
  alice, bob = ("Name", "Alice"), ("Name", "Bob")
  cat, dog = ("Pet", "cat"), ("Pet", "dog")
  house_of = {alice: 0, bob: 2, cat: 1, dog: 0}
  assert zebra.holds(C("found_at", alice, house=1), house_of)
  assert not zebra.holds(C("found_at", bob, house=2), house_of)
  assert zebra.holds(C("not_at", bob, house=2), house_of)
  assert zebra.holds(C("left_of", alice, bob), house_of)
  assert not zebra.holds(C("right_of", alice, bob), house_of)
  assert zebra.holds(C("directly_left", alice, cat), house_of)
  assert not zebra.holds(C("directly_left", alice, bob), house_of)
  assert zebra.holds(C("next_to", cat, bob), house_of)
  assert not zebra.holds(C("next_to", alice, dog), house_of)  # same house
  assert not zebra.holds(C("next_to", alice, bob), house_of)
  assert not zebra.holds(C("one_between", alice, cat), house_of)
  assert zebra.holds(C("same_house", dog, alice), house_of)
  assert not zebra.holds(C("left_of", alice, dog), house_of)
  assert zebra.holds(C("one_between", bob, alice), house_of)
  assert zebra.holds(C("not_same_house", alice, cat), house_of)
  assert not zebra.holds(C("same_house", alice, cat), house_of)
  assert C("directly_left", alice, cat).render() == (
      "Alice is directly left of the cat owner."
  )
  assert C("one_between", cat, bob).render() == (
      "There is one house between the cat owner and Bob."
  )


def test_solver_counts_match_brute_force():
  attrs3 = {
      "Name": ["A", "B", "C"],
      "Pet": ["x", "y", "z"],
      "Drink": ["p", "q", "r"],
  }
  # No clues: (3!)^3 arrangements.
  assert len(zebra.solve(3, attrs3, [], limit=10**6)) == math.factorial(3) ** 3
  rng = random.Random(0)
  house_of = {(a, v): h for a, vs in attrs3.items() for h, v in enumerate(vs)}
  for _ in range(40):
    clues = [
        c
        for c in (zebra._random_clue(rng, house_of, 3) for _ in range(3))
        if c is not None
    ]
    got = zebra.solve(3, attrs3, clues, limit=10**6)
    want = _brute_force(3, attrs3, clues)
    assert sorted(map(sorted, (s.items() for s in got))) == sorted(
        map(sorted, (s.items() for s in want))
    )


def test_hand_made_2x2_puzzle():
  alice, cat = ("Name", "Alice"), ("Pet", "cat")
  one = [C("directly_left", alice, cat)]
  (sol,) = zebra.solve(2, ATTRS_2x2, one)
  assert sol == {alice: 0, ("Name", "Bob"): 1, cat: 1, ("Pet", "dog"): 0}
  assert len(zebra.solve(2, ATTRS_2x2, [C("same_house", alice, cat)])) == 2
  contradiction = [C("found_at", alice, house=1), C("found_at", alice, house=2)]
  assert zebra.solve(2, ATTRS_2x2, contradiction) == []


@pytest.mark.parametrize("houses,attributes", [(2, 2), (3, 3), (4, 3), (4, 4)])
def test_generated_puzzles_are_unique_true_and_minimal(houses, attributes):
  rng = random.Random(houses * 10 + attributes)
  for _ in range(3):
    attrs, clues, house_of = zebra.generate_puzzle(rng, houses, attributes)
    assert list(attrs)[0] == "Name" and len(attrs) == attributes
    assert all(len(v) == houses for v in attrs.values())
    assert all(zebra.holds(c, house_of) for c in clues)
    assert zebra.solve(houses, attrs, clues, limit=5) == [house_of]
    for i in range(len(clues)):
      rest = clues[:i] + clues[i + 1 :]
      assert len(zebra.solve(houses, attrs, rest, limit=2)) == 2


def _answer(grid, reasoning="..."):
  return json.dumps({"reasoning": reasoning, "solution": grid})


GOLD_GRID = {
    "House 1": {"Name": "Bob", "Drink": "tea"},
    "House 2": {"Name": "Alice", "Drink": "milk"},
    "House 3": {"Name": "Carol", "Drink": "water"},
}


def _score(text):
  task = zebra.ZebraTask(data_dir="unused")
  ex = base.Example("z", "", TABLE_3x2)
  verdict = base.score_text(task, ex, text)
  return verdict, task.extra_scores(ex, verdict)["cell_accuracy"]


def test_checker_hand_cases():
  v, acc = _score("Reasoning first.\n" + _answer(GOLD_GRID))
  assert v.correct and v.reward == 1.0 and acc == 1.0
  # Case and surrounding spaces do not matter; a one-item list counts.
  loose = {
      "House 1": {"Name": " BOB ", "Drink": ["Tea"]},
      "House 2": {"Name": "alice", "Drink": "MILK"},
      "House 3": {"Name": "Carol", "Drink": "water "},
  }
  assert _score(_answer(loose))[0].correct
  # Two houses swapped in one column: 2 of 6 cells wrong.
  swapped = json.loads(json.dumps(GOLD_GRID))
  swapped["House 1"]["Drink"], swapped["House 2"]["Drink"] = "milk", "tea"
  v, acc = _score(_answer(swapped))
  assert not v.correct and v.reward == 0.0 and acc == pytest.approx(4 / 6)
  assert v.reason == "4/6 cells correct"
  # A missing house and empty / None cells are wrong cells.
  partial = {"House 1": {"Name": "Bob", "Drink": ""}, "House 2": {"Name": None}}
  assert _score(_answer(partial))[1] == pytest.approx(1 / 6)
  # The last complete JSON object is the answer (braces in strings ignored).
  text = _answer(swapped, "a {draft}") + " then " + _answer(GOLD_GRID, "}{")
  assert _score(text)[0].correct
  # No solution object, or broken JSON: wrong, cell accuracy 0.
  assert _score('{"answer": 3}') == (
      base.Verdict(
          0.0, False, '{"answer": 3}', "no 'solution' object in the answer"
      ),
      0.0,
  )
  v, acc = _score('{"solution": {"House 1": {"Name": "Bob",}}}')
  assert not v.correct and "malformed JSON" in v.reason and acc == 0.0
  v, acc = _score("no json here")
  assert v.answer is None and acc == 0.0


def test_vote_key_ignores_formatting():
  task = zebra.ZebraTask(data_dir="unused")
  loose = json.loads(json.dumps(GOLD_GRID))
  loose["House 3"]["Name"] = " CAROL"
  assert task.answer_key(_answer(GOLD_GRID)) == task.answer_key(
      json.dumps({"solution": loose}, indent=2)
  )


def test_task_generation_and_demonstrations(tmp_path):
  task = registry.get_task(
      "zebra",
      houses=3,
      attributes=2,
      seed=0,
      train_size=40,
      test_size=10,
      data_dir=tmp_path,
  )
  train, test = task.load("train"), task.load("test")
  assert len(train) == 40 and len(test) == 10
  assert not {e.uid for e in train} & {e.uid for e in test}
  # Keyed by the solution grid: no test grid appears in train.
  grids = lambda es: {json.dumps(e.target, sort_keys=True) for e in es}
  assert not grids(train) & grids(test)
  for e in train + test:
    assert e.meta["size"] == "3*2"
    clues = [zebra.Clue.from_json(c) for c in e.meta["clues"]]
    attrs = dict(e.meta["attributes"])
    (sol,) = zebra.solve(3, attrs, clues)
    assert zebra.solution_table(3, attrs, sol) == e.target
    for i, c in enumerate(clues, 1):
      assert f"\n{i}. {c.render()}" in e.prompt
    demo = task.demonstration(e)
    assert base.score_text(task, e, demo).correct
  with pytest.raises(ValueError, match="houses"):
    zebra.ZebraTask(houses=7)
