"""PlanBench Blocksworld (task 1, plan generation) from its local files.

Layout (karthikv792/LLMs-Planning, `plan-bench/`): `prompts/<variant>/
task_1_plan_generation.json` holds the one-shot prompts and a reference plan
per instance; `configs/<variant>.yaml` gives the instance directory, the
domain file and the object encoding (a -> "red block", ...); the PDDL files
hold the `:init` and `:goal` of each instance. Variants: `blocksworld` (500
instances, 4-5 blocks) and `blocksworld_3` (100 instances, 3 blocks).

Scoring is PlanBench's: the model's plan (natural language up to
"[PLAN END]", or PDDL "(unstack yellow orange)") is mapped back to actions on
the PDDL objects with the encoding and checked against the instance's own
initial state and goal; any valid plan counts, not only the reference. The
check runs the action schemas parsed from the domain PDDL as STRIPS
(preconditions, then delete and add lists), which is what VAL does on this
domain. `mutation_report` measures the validator on perturbed reference plans
(results/planbench_validation.md).
"""

import collections
import itertools
import pathlib
from typing import Any, Iterable, Sequence

import yaml

from sat_jax import io_utils
from sat_jax.io_utils import DataFileError
from sat_jax.tasks import base
from sat_jax.tasks import blocksworld
from sat_jax.tasks import files
from sat_jax.tasks import registry

VARIANTS = ("blocksworld", "blocksworld_3")
Fact = tuple[str, ...]


def parse_sexpr(text: str, source: str = "<pddl>") -> list:
  """Nested lists of lower-case atoms; ';' starts a comment."""
  lines = [line.split(";", 1)[0] for line in text.splitlines()]
  tokens = " ".join(lines).replace("(", " ( ").replace(")", " ) ").split()
  stack: list[list] = [[]]
  for tok in tokens:
    if tok == "(":
      stack.append([])
    elif tok == ")":
      if len(stack) == 1:
        raise DataFileError(f"{source}: unbalanced ')'")
      done = stack.pop()
      stack[-1].append(done)
    else:
      stack[-1].append(tok.lower())
  if len(stack) != 1 or len(stack[0]) != 1:
    raise DataFileError(f"{source}: unbalanced parentheses or trailing text")
  return stack[0][0]


def _section(expr: list, key: str, source: str) -> list:
  for item in expr:
    if isinstance(item, list) and item and item[0] == key:
      return item
  raise DataFileError(f"{source}: no {key} section")


def _conjunction(expr: Any, source: str) -> list[Fact]:
  """Atoms of `(and a b ...)` or of a single atom."""
  if not isinstance(expr, list) or not expr:
    raise DataFileError(f"{source}: expected a fact list, got {expr!r}")
  items = expr[1:] if expr[0] == "and" else [expr]
  facts = []
  for atom in items:
    if not isinstance(atom, list) or not all(isinstance(a, str) for a in atom):
      raise DataFileError(f"{source}: unsupported formula {atom!r}")
    facts.append(tuple(atom))
  return facts


def _read_pddl(path: pathlib.Path) -> list:
  if not path.is_file():
    raise DataFileError(f"{path}: no such file")
  return parse_sexpr(path.read_text(), str(path))


def read_problem(path: str | pathlib.Path) -> dict[str, Any]:
  """{"objects", "init", "goal"} of a PDDL problem file."""
  path = pathlib.Path(path)
  expr = _read_pddl(path)
  init = _section(expr, ":init", str(path))[1:]
  goal = _section(expr, ":goal", str(path))
  if len(goal) != 2:
    raise DataFileError(f"{path}: :goal must hold one formula")
  return {
      "objects": _section(expr, ":objects", str(path))[1:],
      "init": _conjunction(["and", *init], str(path)),
      "goal": _conjunction(goal[1], str(path)),
  }


def read_domain(path: str | pathlib.Path) -> dict[str, dict[str, Any]]:
  """Schemas {name: {"params", "pre", "add", "del"}} of a STRIPS domain."""
  path = pathlib.Path(path)
  expr = _read_pddl(path)
  actions = {}
  for item in expr:
    if not (isinstance(item, list) and item and item[0] == ":action"):
      continue
    fields = dict(zip(item[2::2], item[3::2]))
    src = f"{path} action {item[1]}"
    effect = fields.get(":effect")
    if not isinstance(effect, list) or not effect:
      raise DataFileError(f"{src}: missing :effect")
    parts = effect[1:] if effect[0] == "and" else [effect]
    negated = [p[1] for p in parts if isinstance(p, list) and p[0] == "not"]
    positive = [p for p in parts if not (isinstance(p, list) and p[0] == "not")]
    actions[item[1]] = {
        "params": [p for p in fields.get(":parameters", []) if p[0] == "?"],
        "pre": _conjunction(fields.get(":precondition"), src),
        "add": _conjunction(["and", *positive], src + " :effect"),
        "del": _conjunction(["and", *negated], src + " :effect"),
    }
  if not actions:
    raise DataFileError(f"{path}: no :action found")
  return actions


def ground(atoms: Iterable[Fact], binding: dict[str, str]) -> list[Fact]:
  return [tuple(binding.get(a, a) for a in atom) for atom in atoms]


def simulate(
    domain: dict[str, dict[str, Any]],
    init: Iterable[Fact],
    goal: Iterable[Fact],
    plan: Sequence[Fact],
) -> tuple[bool, str]:
  """STRIPS execution of a ground plan (VAL's check); (valid, reason)."""
  state = set(init)
  for i, step in enumerate(plan):
    schema = domain.get(step[0])
    if schema is None or len(step) - 1 != len(schema["params"]):
      return False, f"step {i + 1} {step}: unknown action or wrong arity"
    binding = dict(zip(schema["params"], step[1:]))
    for p in ground(schema["pre"], binding):
      if p not in state:
        return False, f"step {i + 1} {step}: precondition {p} is false"
    state -= set(ground(schema["del"], binding))
    state |= set(ground(schema["add"], binding))
  missing = [g for g in goal if g not in state]
  if missing:
    return False, f"goal not reached: missing {missing}"
  return True, ""


@registry.register("planbench")
class PlanBenchTask(base.Task):
  """PlanBench Blocksworld plan generation; `path` is the plan-bench folder."""

  name = "planbench"

  def __init__(self, path: str | pathlib.Path, variant: str = "blocksworld"):
    if variant not in VARIANTS:
      raise ValueError(f"unknown variant {variant!r}; expected {VARIANTS}")
    root = pathlib.Path(path).expanduser()
    if (root / "plan-bench").is_dir():
      root = root / "plan-bench"
    config_path = root / "configs" / f"{variant}.yaml"
    if not config_path.is_file():
      raise DataFileError(f"{config_path}: no such file (path={path})")
    config = yaml.safe_load(config_path.read_text())
    for key in ("instance_dir", "domain_file", "instances_template"):
      if key not in (config or {}):
        raise DataFileError(f"{config_path}: missing field {key!r}")
    encoding = config.get("encoded_objects") or {}
    if not encoding:
      raise DataFileError(f"{config_path}: missing field 'encoded_objects'")
    self.root, self.variant, self.config = root, variant, config
    # "red block" -> "red": the colour word is what plans name (PDDL form).
    self.color_of = {k: v.split()[0].lower() for k, v in encoding.items()}
    self.letter_of = {v: k for k, v in self.color_of.items()}
    self.domain = read_domain(root / "instances" / config["domain_file"])
    self.prompts_path = (
        root / "prompts" / variant / "task_1_plan_generation.json"
    )

  def instance_path(self, instance_id: int) -> pathlib.Path:
    name = self.config["instances_template"].format(instance_id)
    return self.root / "instances" / self.config["instance_dir"] / name

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    data = io_utils.read_json(self.prompts_path)
    items = data.get("instances") if isinstance(data, dict) else None
    if not items:
      raise DataFileError(f"{self.prompts_path}: no 'instances' list")
    examples = []
    for i, item in enumerate(items):
      files.require_fields(
          item,
          ("instance_id", "query", "ground_truth_plan"),
          f"{self.prompts_path}: instance #{i}",
      )
      problem = read_problem(self.instance_path(item["instance_id"]))
      examples.append(
          base.Example(
              uid=f"{self.variant}-{item['instance_id']}",
              prompt=item["query"],
              target={
                  "objects": problem["objects"],
                  "init": [list(f) for f in problem["init"]],
                  "goal": [list(f) for f in problem["goal"]],
              },
              meta={"reference_plan": item["ground_truth_plan"]},
          )
      )
    return examples

  def extract_answer(self, text: str) -> str | None:
    plan = blocksworld.parse_plan(text, sorted(self.letter_of))
    return blocksworld.plan_text(plan) if plan else None

  def to_objects(self, plan: Sequence[Fact]) -> list[Fact]:
    """Colour names to PDDL objects; an unknown name stays (and fails)."""
    return [(a[0], *(self.letter_of.get(o, o) for o in a[1:])) for a in plan]

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    plan = self.to_objects(
        blocksworld.parse_plan(answer, sorted(self.letter_of))
    )
    valid, reason = simulate(
        self.domain,
        [tuple(f) for f in example.target["init"]],
        [tuple(f) for f in example.target["goal"]],
        plan,
    )
    return base.Verdict(float(valid), valid, answer, reason)

  def answer_key(self, answer: str) -> str:
    return answer.strip()

  def mutation_report(self) -> dict[str, Any]:
    """Validity of every reference plan and of each one-step mutation.

    Mutations: each step removed; each pair of different steps swapped.
    Returns counts plus the mutated plans that are still valid (a swap of
    two independent steps can be), so that none is hidden.
    """
    counts = collections.Counter(
        dict.fromkeys(("removals_valid", "swaps_valid"), 0)
    )
    still_valid = []
    for ex in self.load("test"):
      plan = self.to_objects(blocksworld.parse_plan(ex.meta["reference_plan"]))
      init = [tuple(f) for f in ex.target["init"]]
      goal = [tuple(f) for f in ex.target["goal"]]
      counts["plans"] += 1
      counts["reference_valid"] += simulate(self.domain, init, goal, plan)[0]
      for kind, what, mutated in mutations(plan):
        counts[kind] += 1
        if simulate(self.domain, init, goal, mutated)[0]:
          counts[kind + "_valid"] += 1
          still_valid.append(f"{ex.uid}: {what}")
    return {"counts": dict(counts), "still_valid": still_valid}


def mutations(plan: Sequence[Fact]) -> Iterable[tuple[str, str, list[Fact]]]:
  """(kind, description, plan) for each one-step removal and each swap."""
  for i in range(len(plan)):
    yield "removals", f"remove step {i + 1}", list(plan[:i]) + list(
        plan[i + 1 :]
    )
  for i, j in itertools.combinations(range(len(plan)), 2):
    if plan[i] != plan[j]:
      swapped = list(plan)
      swapped[i], swapped[j] = plan[j], plan[i]
      yield "swaps", f"swap steps {i + 1} and {j + 1}", swapped
