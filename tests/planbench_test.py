"""Tests of the PlanBench Blocksworld loader and plan validation."""

import collections
import json
import random

import pytest

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import base
from sat_jax.tasks import blocksworld as bw
from sat_jax.tasks import planbench as pb

DOMAIN = """(define (domain blocksworld-4ops)
  (:requirements :strips)
(:predicates (clear ?x) (ontable ?x) (handempty) (holding ?x) (on ?x ?y))
(:action pick-up
  :parameters (?ob)
  :precondition (and (clear ?ob) (ontable ?ob) (handempty))
  :effect (and (holding ?ob) (not (clear ?ob)) (not (ontable ?ob))
               (not (handempty))))
(:action put-down
  :parameters  (?ob)
  :precondition (holding ?ob)
  :effect (and (clear ?ob) (handempty) (ontable ?ob) (not (holding ?ob))))
(:action stack
  :parameters  (?ob ?underob)
  :precondition (and (clear ?underob) (holding ?ob))
  :effect (and (handempty) (clear ?ob) (on ?ob ?underob)
               (not (clear ?underob)) (not (holding ?ob))))
(:action unstack
  :parameters  (?ob ?underob)
  :precondition (and (on ?ob ?underob) (clear ?ob) (handempty))
  :effect (and (holding ?ob) (clear ?underob)
               (not (on ?ob ?underob)) (not (clear ?ob)) (not (handempty)))))
"""

# a on b, c on the table; goal c on a (optimal: pick-up c, stack c a).
PROBLEM = """(define (problem BW-rand-3)
(:domain blocksworld-4ops)
(:objects a b c )
(:init (handempty) (on a b) (ontable b) (ontable c) (clear a) (clear c))
(:goal (and (on c a)))
)
"""

CONFIG = """instance_dir: blocksworld/generated_basic
domain_file: blocksworld/generated_domain.pddl
instances_template: instance-{}.pddl
actions:
  {pick-up: "pick up the {}", put-down: "put down the {}",
   stack: "stack the {} on top of the {}",
   unstack: "unstack the {} from on top of the {}"}
encoded_objects: {"a": "red block", "b": "blue block", "c": "orange block"}
"""


def _layout(tmp_path, prompts=None, problem=PROBLEM):
  root = tmp_path / "plan-bench"
  inst = root / "instances" / "blocksworld"
  (inst / "generated_basic").mkdir(parents=True)
  (inst / "generated_domain.pddl").write_text(DOMAIN)
  (inst / "generated_basic" / "instance-7.pddl").write_text(problem)
  (root / "configs").mkdir()
  (root / "configs" / "blocksworld.yaml").write_text(CONFIG)
  (root / "prompts" / "blocksworld").mkdir(parents=True)
  if prompts is None:
    prompts = {
        "instances": [{
            "instance_id": 7,
            "query": "[STATEMENT] ... [PLAN]",
            "ground_truth_plan": "(pick-up orange)\n(stack orange red)\n",
        }]
    }
  text = prompts if isinstance(prompts, str) else json.dumps(prompts)
  (root / "prompts" / "blocksworld" / "task_1_plan_generation.json").write_text(
      text
  )
  return tmp_path


def test_fixture_instance_scoring(tmp_path):
  task = pb.PlanBenchTask(_layout(tmp_path))
  (ex,) = task.load("test")
  assert ex.uid == "blocksworld-7"
  assert sorted(map(tuple, ex.target["init"])) == sorted([
      ("handempty",), ("on", "a", "b"), ("ontable", "b"), ("ontable", "c"),
      ("clear", "a"), ("clear", "c"),
  ])  # fmt: skip
  assert ex.target["goal"] == [["on", "c", "a"]]
  nl = (
      "pick up the orange block\nstack the orange block on top of the red"
      " block\n[PLAN END]"
  )
  assert base.score_text(task, ex, nl).correct
  assert base.score_text(task, ex, ex.meta["reference_plan"]).correct
  # Another valid (longer) plan counts too: any plan reaching the goal does.
  detour = (
      "(pick-up orange)\n(put-down orange)\n(pick-up orange)\n(stack orange"
      " red)"
  )
  assert base.score_text(task, ex, detour).correct
  wrong = base.score_text(task, ex, "(pick-up red)\n(stack red orange)")
  assert not wrong.correct and "precondition" in wrong.reason
  goal = base.score_text(task, ex, "(pick-up orange)\n(stack orange blue)")
  assert not goal.correct and "precondition ('clear', 'b')" in goal.reason
  assert base.score_text(task, ex, "no plan").reason == "no answer found"


def test_domain_equals_hand_coded_operators(tmp_path):
  domain = pb.read_domain(_layout(tmp_path) / "plan-bench" / "instances" /
                          "blocksworld" / "generated_domain.pddl")  # fmt: skip
  for name, arity in bw.ARITY.items():
    args = ("x", "y")[:arity]
    schema = domain[name]
    binding = dict(zip(schema["params"], args))
    pre, add, delete = bw.schema((name, *args))
    assert set(pb.ground(schema["pre"], binding)) == set(pre)
    assert set(pb.ground(schema["add"], binding)) == set(add)
    assert set(pb.ground(schema["del"], binding)) == set(delete)


def test_bad_files(tmp_path):
  with pytest.raises(DataFileError, match="blocksworld.yaml: no such file"):
    pb.PlanBenchTask(tmp_path)
  with pytest.raises(ValueError, match="unknown variant"):
    pb.PlanBenchTask(tmp_path, variant="logistics")
  bad_json = _layout(tmp_path / "j", prompts="{not json")
  with pytest.raises(
      DataFileError, match="task_1_plan_generation.json:1: malformed"
  ):
    pb.PlanBenchTask(bad_json).load()
  no_field = _layout(
      tmp_path / "f", prompts={"instances": [{"instance_id": 7}]}
  )
  with pytest.raises(DataFileError, match=r"instance #0: missing field\(s\)"):
    pb.PlanBenchTask(no_field).load()
  empty = _layout(tmp_path / "e", prompts={"instances": []})
  with pytest.raises(DataFileError, match="no 'instances' list"):
    pb.PlanBenchTask(empty).load()
  unbalanced = _layout(tmp_path / "u", problem=PROBLEM + ")")
  with pytest.raises(DataFileError, match="instance-7.pddl: unbalanced"):
    pb.PlanBenchTask(unbalanced).load()
  no_goal = _layout(tmp_path / "g", problem=PROBLEM.replace(":goal", ":other"))
  with pytest.raises(DataFileError, match="no :goal section"):
    pb.PlanBenchTask(no_goal).load()


def _tower_valid(init, goal, plan):
  """Independent check with an explicit on-map and hand (not fact sets)."""
  below = {f[1]: f[2] for f in init if f[0] == "on"}
  below.update({f[1]: None for f in init if f[0] == "ontable"})
  hand = None
  for act, *args in plan:
    x = args[0]
    covered = x in below.values()
    if act in ("pick-up", "unstack"):
      support = None if act == "pick-up" else args[1]
      if hand or covered or x not in below or below[x] != support:
        return False
      del below[x]
      hand = x
    elif hand != x:
      return False
    elif act == "put-down":
      below[x], hand = None, None
    else:
      y = args[1]
      if y not in below or y in below.values():
        return False
      below[x], hand = y, None
  return all(below.get(g[1]) == g[2] for g in goal)


def test_random_plans_agree_with_independent_simulator(tmp_path):
  domain = pb.read_domain(_layout(tmp_path) / "plan-bench" / "instances" /
                          "blocksworld" / "generated_domain.pddl")  # fmt: skip
  rng = random.Random(0)
  names = "abcd"
  ground = [("pick-up", x) for x in names] + [("put-down", x) for x in names]
  ground += [
      (a, x, y) for a in ("stack", "unstack") for x in names for y in names
  ]
  goals = [[]] + [[("on", x, y)] for x in names for y in names if x != y]
  outcomes = collections.Counter()
  for _ in range(600):
    # A random legal walk, then (half the time) one random, often illegal,
    # action.
    init = bw.state_from_stacks(bw.random_stacks(rng, names))
    plan, state = [], init
    for _ in range(rng.randint(0, 10)):
      action, state = rng.choice(list(bw.successors(state)))
      plan.append(action)
    if rng.random() < 0.5:
      plan.append(rng.choice(ground))
    for goal in goals:
      ours = pb.simulate(domain, init, goal, plan)[0]
      assert ours == _tower_valid(init, goal, plan), (sorted(init), goal, plan)
      outcomes[ours] += 1
  assert min(outcomes.values()) > 200  # valid and invalid plans both seen


@pytest.mark.benchdata
@pytest.mark.parametrize(
    "variant,count", [("blocksworld", 500), ("blocksworld_3", 100)]
)
def test_every_reference_plan_validates(shared_benchmarks, variant, count):
  task = pb.PlanBenchTask(shared_benchmarks / "planbench", variant)
  examples = task.load("test")
  assert len(examples) == count
  templates = task.config["actions"]
  for ex in examples:
    ref = ex.meta["reference_plan"]
    assert base.score_text(task, ex, ref).correct, ex.uid
    # The same plan in PlanBench's natural language, rendered from the YAML.
    plan = bw.parse_plan(ref)
    nl = "\n".join(
        templates[a[0]].format(*(f"{o} block" for o in a[1:])) for a in plan
    )
    assert base.score_text(task, ex, nl + "\n[PLAN END]").correct, ex.uid
    # The reference plans are optimal (so no step can be dropped).
    init = [tuple(f) for f in ex.target["init"]]
    goal = [tuple(f) for f in ex.target["goal"]]
    assert len(bw.optimal_plan(frozenset(init), goal)) == len(plan), ex.uid


@pytest.mark.benchdata
@pytest.mark.parametrize("variant", ["blocksworld", "blocksworld_3"])
def test_mutated_plans_fail_unless_still_valid(shared_benchmarks, variant):
  task = pb.PlanBenchTask(shared_benchmarks / "planbench", variant)
  report = task.mutation_report()
  counts = report["counts"]
  assert counts["reference_valid"] == counts["plans"]
  assert counts["removals_valid"] == 0  # a shorter plan would beat the optimum
  independent_still_valid = 0
  for ex in task.load("test"):
    plan = task.to_objects(bw.parse_plan(ex.meta["reference_plan"]))
    init = [tuple(f) for f in ex.target["init"]]
    goal = [tuple(f) for f in ex.target["goal"]]
    assert _tower_valid(init, goal, plan)
    for kind, _, mutated in pb.mutations(plan):
      theirs = _tower_valid(init, goal, mutated)
      assert pb.simulate(task.domain, init, goal, mutated)[0] == theirs
      independent_still_valid += theirs and kind == "swaps"
  assert counts["swaps_valid"] == independent_still_valid
  assert len(report["still_valid"]) == counts["swaps_valid"]
