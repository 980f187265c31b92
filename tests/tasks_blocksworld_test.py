"""Tests of the Blocksworld simulator, validator, parser, planner and task."""

import random

import pytest

from sat_jax.tasks import base
from sat_jax.tasks import blocksworld as bw
from sat_jax.tasks import datasets
from sat_jax.tasks import registry


def _towers_apply(towers, holding, action):
  """Independent simulator: towers are bottom-to-top lists, or None if illegal.

  Written from the English rules of the PlanBench prompt, not from the PDDL.
  """
  towers = [list(t) for t in towers]
  name, args = action[0], action[1:]
  top = {t[-1]: i for i, t in enumerate(towers)}
  if name in ("pick-up", "unstack"):
    x = args[0]
    if holding is not None or x not in top:
      return None
    tower = towers[top[x]]
    if name == "pick-up" and len(tower) != 1:
      return None
    if name == "unstack" and (len(tower) < 2 or tower[-2] != args[1]):
      return None
    tower.pop()
    return [t for t in towers if t], x
  if holding != args[0]:
    return None
  if name == "put-down":
    return towers + [[args[0]]], None
  if args[1] not in top:
    return None
  towers[top[args[1]]].append(args[0])
  return towers, None


def _towers_key(towers, holding):
  return (tuple(sorted(tuple(t) for t in towers)), holding)


def _towers_bfs(stacks, goal_on, names):
  """Optimal length by BFS over all ground actions with `_towers_apply`."""
  actions = [("pick-up", x) for x in names] + [("put-down", x) for x in names]
  actions += [
      (a, x, y) for a in ("stack", "unstack") for x in names for y in names
  ]
  start = ([list(s) for s in stacks], None)
  seen, frontier, depth = {_towers_key(*start)}, [start], 0
  while frontier:
    for towers, holding in frontier:
      pairs = {(t[i + 1], t[i]) for t in towers for i in range(len(t) - 1)}
      if set(goal_on) <= pairs:
        return depth
    nxt = []
    for towers, holding in frontier:
      for a in actions:
        out = _towers_apply(towers, holding, a)
        if out is not None and _towers_key(*out) not in seen:
          seen.add(_towers_key(*out))
          nxt.append(out)
    frontier, depth = nxt, depth + 1
  raise AssertionError("unreachable")


def test_operators_by_hand():
  s = bw.state_from_stacks([["red", "blue"], ["orange"]])
  assert s == {
      ("handempty",), ("ontable", "red"), ("on", "blue", "red"),
      ("clear", "blue"), ("ontable", "orange"), ("clear", "orange"),
  }  # fmt: skip
  after, _ = bw.apply(s, ("unstack", "blue", "red"))
  assert after == {
      ("ontable", "red"), ("clear", "red"), ("holding", "blue"),
      ("ontable", "orange"), ("clear", "orange"),
  }  # fmt: skip
  stacked, _ = bw.apply(after, ("stack", "blue", "orange"))
  assert ("on", "blue", "orange") in stacked and (
      "clear",
      "orange",
  ) not in stacked
  assert ("handempty",) in stacked and ("clear", "blue") in stacked
  bad = {
      ("pick-up", "blue"): "(ontable blue)",  # on a block, not the table
      ("pick-up", "red"): "(clear red)",  # under blue
      ("unstack", "blue", "orange"): "(on blue orange)",
      ("put-down", "blue"): "(holding blue)",
      ("stack", "orange", "blue"): "(holding orange)",
  }
  for action, fact in bad.items():
    nxt, why = bw.apply(s, action)
    assert nxt is None and fact in why, (action, why)
  nxt, why = bw.apply(after, ("pick-up", "orange"))  # hand is full
  assert nxt is None and "(handempty)" in why


def test_validate_and_sussman_anomaly():
  init = bw.state_from_stacks([["a", "c"], ["b"]])  # C on A; B on the table
  goal = [("on", "a", "b"), ("on", "b", "c")]
  plan = bw.optimal_plan(init, goal)
  assert len(plan) == 6
  assert bw.validate(init, goal, plan).valid
  # The "natural" plan that first stacks A on B cannot finish in 6 steps.
  naive = [
      ("unstack", "c", "a"), ("put-down", "c"), ("pick-up", "a"),
      ("stack", "a", "b"), ("pick-up", "b"), ("stack", "b", "c"),
  ]  # fmt: skip
  check = bw.validate(init, goal, naive)
  assert not check.valid and check.steps_executed == 4
  assert check.reason.startswith("step 5 (pick-up b): precondition (clear b)")
  short = bw.validate(init, goal, plan[:4])
  assert not short.valid and "missing (on a b)" in short.reason


def test_hand_counted_optimal_lengths():
  cases = [
      ([["red", "blue"]], [("on", "red", "blue")], 4),  # swap a 2-tower
      ([["a"], ["b"], ["c"]], [("on", "a", "b"), ("on", "b", "c")], 4),
      ([["a", "b", "c"]], [("on", "c", "b")], 0),  # already true
      ([["a", "b", "c"]], [("on", "a", "b"), ("on", "b", "c")], 6),  # reverse
  ]
  for stacks, goal, length in cases:
    assert len(bw.optimal_plan(bw.state_from_stacks(stacks), goal)) == length


@pytest.mark.parametrize("num_blocks", [3, 4])
def test_bfs_matches_independent_planner(num_blocks):
  rng = random.Random(num_blocks)
  names = bw.COLORS[:num_blocks]
  for _ in range(15):
    stacks = bw.random_stacks(rng, names)
    target = bw.random_stacks(rng, names)
    goal_on = [(t[i + 1], t[i]) for t in target for i in range(len(t) - 1)]
    plan = bw.optimal_plan(
        bw.state_from_stacks(stacks), [("on", *g) for g in goal_on]
    )
    assert len(plan) == _towers_bfs(stacks, goal_on, names)
    towers, holding = stacks, None
    for action in plan:  # the plan is legal under the independent rules too
      towers, holding = _towers_apply(towers, holding, action)


def test_parse_plan_forms():
  text = (
      "Here is my plan:\n"
      "1. Unstack the yellow block from on top of the orange block\n"
      "put down the yellow block\n"
      "(pick-up orange) (stack orange red)\n"
      "stack the red block\n"  # one block for a 2-block action: skipped
      "pick up the purple block\n"  # unknown block: skipped
      "[PLAN END]\n"
      "pick up the blue block\n"
  )
  assert bw.parse_plan(text) == [
      ("unstack", "yellow", "orange"),
      ("put-down", "yellow"),
      ("pick-up", "orange"),
      ("stack", "orange", "red"),
  ]
  # The end marker in lower case ends the plan too.
  lower = text.replace("[PLAN END]", "[plan end]")
  assert bw.parse_plan(lower) == bw.parse_plan(text)
  assert bw.parse_plan("the blue block is stacked on the red block") == []
  assert bw.plan_text([("stack", "a", "b"), ("put-down", "c")]) == (
      "(stack a b)\n(put-down c)"
  )


@pytest.fixture(scope="module")
def small_task(tmp_path_factory):
  return bw.BlocksworldTask(
      num_blocks=3, min_steps=2, max_steps=6, train_size=30, test_size=8,
      data_dir=tmp_path_factory.mktemp("bw"),
  )  # fmt: skip


def test_task_splits_disjoint_and_graded(small_task):
  train, test = small_task.load("train"), small_task.load("test")
  assert (len(train), len(test)) == (30, 8)
  keys = {}
  for split, examples in (("train", train), ("test", test)):
    for ex in examples:
      key = bw.problem_key(ex.target["init"], ex.target["goal"])
      assert datasets.hash_split(key, 0.2) == split
      keys[key] = split
      assert 2 <= ex.meta["optimal_length"] <= 6
  assert len(keys) == 38  # no problem twice, none in both splits
  again = bw.BlocksworldTask(
      num_blocks=3, min_steps=2, max_steps=6, train_size=30, test_size=8,
      data_dir=small_task.data_dir,
  ).load("test")  # fmt: skip
  assert [e.uid for e in again] == [e.uid for e in test]


def test_task_scoring(small_task):
  for ex in small_task.load("test"):
    demo = small_task.demonstration(ex)
    assert base.score_text(small_task, ex, demo).correct
    steps = demo.splitlines()[:-1]
    short = base.score_text(small_task, ex, "\n".join(steps[:-1]))
    assert not short.correct and short.reward == 0.0
  ex = small_task.load("test")[0]
  assert "Goal:" in ex.prompt and bw.PLAN_END in ex.prompt
  assert (
      base.score_text(small_task, ex, "I give up").reason == "no answer found"
  )
  crashed = base.score_text(small_task, ex, None)  # not text: parser raises
  assert not crashed.correct and "extractor error" in crashed.reason


def test_bad_arguments_and_exhaustion(tmp_path):
  with pytest.raises(ValueError, match="num_blocks"):
    bw.BlocksworldTask(num_blocks=1)
  with pytest.raises(ValueError, match="min_steps"):
    bw.BlocksworldTask(min_steps=5, max_steps=3)
  with pytest.raises(ValueError, match="test_fraction"):
    bw.BlocksworldTask(test_fraction=0.0)
  task = bw.BlocksworldTask(num_blocks=2, train_size=50, data_dir=tmp_path)
  with pytest.raises(Exception, match="found only"):
    task.load("train")


def test_registered():
  task = registry.get_task("blocksworld", num_blocks=3, data_dir="/nonexistent")
  assert isinstance(task, bw.BlocksworldTask)


def test_argument_errors_name_the_parameter_and_value():
  # A string or float count used to fail with a bare TypeError (in the range
  # comparison, or later slicing the block names).
  with pytest.raises(ValueError, match="num_blocks must be an int .*got '4'"):
    bw.BlocksworldTask(num_blocks="4")
  with pytest.raises(ValueError, match="num_blocks must be an int .*got 4.5"):
    bw.BlocksworldTask(num_blocks=4.5)
  with pytest.raises(ValueError, match="min_steps must be an int .*got 1.5"):
    bw.BlocksworldTask(min_steps=1.5)
  with pytest.raises(ValueError, match="max_steps must be an int .*got '3'"):
    bw.BlocksworldTask(max_steps="3")
  with pytest.raises(ValueError, match="max_steps=3 is below min_steps=5"):
    bw.BlocksworldTask(min_steps=5, max_steps=3)
