"""Blocksworld planning: the 4-operator STRIPS domain, plans, and a generator.

State and semantics. A state is a frozenset of ground facts, as in PDDL:
`("on", x, y)`, `("ontable", x)`, `("clear", x)`, `("handempty",)`,
`("holding", x)`. The operators are PlanBench's `generated_domain.pddl`:

  pick-up x:    pre clear x, ontable x, handempty
                add holding x; del clear x, ontable x, handempty
  put-down x:   pre holding x
                add clear x, handempty, ontable x; del holding x
  stack x y:    pre clear y, holding x
                add handempty, clear x, on x y; del clear y, holding x
  unstack x y:  pre on x y, clear x, handempty
                add holding x, clear y; del on x y, clear x, handempty

A plan is valid iff every step's preconditions hold when it is applied and
the goal facts hold at the end (VAL's check on this STRIPS domain).

Plan text. `parse_plan` reads one action per line, up to "[PLAN END]", in
PlanBench's natural language ("unstack the yellow block from on top of the
orange block") or in PDDL form ("(unstack yellow orange)"). Like PlanBench's
`text_to_plan`, a line counts when it names an action and exactly as many
known blocks as the action takes (in order of appearance); other lines are
skipped.

The synthetic task `blocksworld` draws random start and goal configurations
of `num_blocks` blocks (named by PlanBench's colours), solves each by
breadth-first search (so the reference plan is optimal and its length grades
difficulty), and stores the problems as a `synthetic.SampledTask`. The goal
is the set of `on` facts of the goal configuration, as in PlanBench.
"""

import collections
import dataclasses
import hashlib
import random
import re
from typing import Any, Iterable, Iterator, Sequence

from sat_jax.tasks import base
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic

Fact = tuple[str, ...]
Action = tuple[str, ...]
State = frozenset

ARITY = {"pick-up": 1, "put-down": 1, "stack": 2, "unstack": 2}
# PlanBench's object encoding order (configs/blocksworld.yaml), colour only.
COLORS = (
    "red", "blue", "orange", "yellow", "white", "magenta",
    "black", "cyan", "green", "violet", "silver", "gold",
)  # fmt: skip
MAX_BLOCKS = 7  # BFS explores ~66k states at 7 blocks; more is too slow.
PLAN_END = "[PLAN END]"


def schema(action: Action) -> tuple[list[Fact], list[Fact], list[Fact]]:
  """(preconditions, add list, delete list) of a ground action."""
  name, args = action[0], action[1:]
  if name not in ARITY or len(args) != ARITY[name]:
    raise ValueError(f"unknown action or wrong arity: {action}")
  x = args[0]
  if name == "pick-up":
    pre = [("clear", x), ("ontable", x), ("handempty",)]
    return pre, [("holding", x)], pre
  if name == "put-down":
    return (
        [("holding", x)],
        [("clear", x), ("handempty",), ("ontable", x)],
        [("holding", x)],
    )
  y = args[1]
  if name == "stack":
    pre = [("clear", y), ("holding", x)]
    return pre, [("handempty",), ("clear", x), ("on", x, y)], pre
  pre = [("on", x, y), ("clear", x), ("handempty",)]
  return pre, [("holding", x), ("clear", y)], pre


def fact_text(fact: Fact) -> str:
  return "(" + " ".join(fact) + ")"


def apply(state: State, action: Action) -> tuple[State | None, str]:
  """The successor state, or (None, reason) when a precondition fails."""
  pre, add, delete = schema(action)
  for p in pre:
    if p not in state:
      return None, f"precondition {fact_text(p)} is false"
  return (state - frozenset(delete)) | frozenset(add), ""


@dataclasses.dataclass(frozen=True)
class PlanCheck:
  """Result of simulating a plan: valid iff executable and reaching the goal."""

  valid: bool
  reason: str  # empty when valid
  steps_executed: int
  final_state: State


def validate(
    init: Iterable[Fact], goal: Iterable[Fact], plan: Sequence[Action]
) -> PlanCheck:
  """Simulates `plan` from `init` and checks that every goal fact holds."""
  state = frozenset(tuple(f) for f in init)
  for i, action in enumerate(plan):
    nxt, why = apply(state, tuple(action))
    if nxt is None:
      reason = f"step {i + 1} {fact_text(action)}: {why}"
      return PlanCheck(False, reason, i, state)
    state = nxt
  missing = [fact_text(tuple(g)) for g in goal if tuple(g) not in state]
  if missing:
    reason = f"goal not reached: missing {', '.join(missing)}"
    return PlanCheck(False, reason, len(plan), state)
  return PlanCheck(True, "", len(plan), state)


def state_from_stacks(stacks: Sequence[Sequence[str]]) -> State:
  """Facts of towers listed bottom to top, with the hand empty."""
  facts: set[Fact] = {("handempty",)}
  for stack in stacks:
    if not stack:
      raise ValueError(f"empty stack in {stacks}")
    facts.add(("ontable", stack[0]))
    facts.update(("on", a, b) for b, a in zip(stack, stack[1:]))
    facts.add(("clear", stack[-1]))
  return frozenset(facts)


def successors(state: State) -> Iterator[tuple[Action, State]]:
  """All applicable actions of a consistent state, with their results."""
  holding = [f[1] for f in state if f[0] == "holding"]
  clear = sorted(f[1] for f in state if f[0] == "clear")
  if holding:
    x = holding[0]
    candidates = [("put-down", x)] + [("stack", x, y) for y in clear]
  else:
    below = {f[1]: f[2] for f in state if f[0] == "on"}
    candidates = [
        ("unstack", x, below[x]) if x in below else ("pick-up", x)
        for x in clear
    ]
  for action in candidates:
    nxt, _ = apply(state, action)
    if nxt is not None:
      yield action, nxt


def optimal_plan(init: State, goal: Iterable[Fact]) -> list[Action]:
  """A shortest plan by breadth-first search (raises if none exists)."""
  goal = frozenset(tuple(g) for g in goal)
  parent: dict[State, tuple[State, Action] | None] = {init: None}
  queue = collections.deque([init])
  while queue:
    state = queue.popleft()
    if goal <= state:
      plan = []
      while parent[state] is not None:
        state, action = parent[state]
        plan.append(action)
      return plan[::-1]
    for action, nxt in successors(state):
      if nxt not in parent:
        parent[nxt] = (state, action)
        queue.append(nxt)
  raise ValueError("goal unreachable from the initial state")


def _block_pattern(names: Sequence[str]) -> re.Pattern:
  alts = "|".join(sorted((re.escape(n) for n in names), key=len, reverse=True))
  return re.compile(rf"\b({alts})\b")


_ACTION_RE = re.compile(r"(?<![\w-])(pick-up|put-down|unstack|stack)\b")


def parse_plan(text: str, names: Sequence[str] = COLORS) -> list[Action]:
  """Actions in `text` (natural language or PDDL), up to "[PLAN END]".

  The marker is matched in any case ("[plan end]"), as the actions are.
  """
  text = text.lower().split(PLAN_END.lower(), 1)[0]
  text = re.sub(r"\bpick[\s_-]+up\b", "pick-up", text)
  text = re.sub(r"\bput[\s_-]+down\b", "put-down", text)
  text = re.sub(r"\)\s*\(", ")\n(", text)  # PDDL actions on one line
  blocks = _block_pattern(names)
  plan = []
  for line in text.splitlines():
    act = _ACTION_RE.search(line)
    if act is None:
      continue
    objs = blocks.findall(line)
    if len(objs) == ARITY[act.group(1)]:
      plan.append((act.group(1), *objs))
  return plan


def plan_text(plan: Sequence[Action]) -> str:
  """PDDL form, one action per line: the canonical answer string."""
  return "\n".join(fact_text(a) for a in plan)


def describe(state: State) -> str:
  """Short text of a hand-empty state: 'red on blue, blue on table'."""
  on = sorted(f"{f[1]} on {f[2]}" for f in state if f[0] == "on")
  table = sorted(f"{f[1]} on table" for f in state if f[0] == "ontable")
  return ", ".join(on + table)


def problem_key(init: Iterable[Fact], goal: Iterable[Fact]) -> str:
  """Canonical text of a problem (the key of its train/test split)."""
  i = ";".join(sorted(fact_text(tuple(f)) for f in init))
  g = ";".join(sorted(fact_text(tuple(f)) for f in goal))
  return f"init:{i}|goal:{g}"


def random_stacks(rng: random.Random, names: Sequence[str]) -> list[list[str]]:
  order = list(names)
  rng.shuffle(order)
  stacks, current = [], [order[0]]
  for name in order[1:]:
    if rng.random() < 0.5:
      stacks.append(current)
      current = []
    current.append(name)
  return stacks + [current]


@registry.register("blocksworld")
class BlocksworldTask(synthetic.SampledTask):
  """Synthetic Blocksworld: write a plan from a start to a goal.

  Difficulty: `num_blocks`, and the optimal plan length kept in [min_steps,
  max_steps]. Every candidate problem is solved by BFS when the data is first
  prepared: about 1 ms a problem at 4 blocks, 60 ms at 6 and 1 s at 7 (2-core
  machine, noisy).
  """

  name = "blocksworld"

  def __init__(
      self,
      num_blocks: int = 4,
      min_steps: int = 2,
      max_steps: int | None = None,
      *,
      test_size: int = 100,
      **kwargs,
  ):
    synthetic.check_int("blocksworld", "num_blocks", num_blocks, 2, MAX_BLOCKS)
    synthetic.check_int("blocksworld", "min_steps", min_steps, 1)
    if max_steps is not None:
      synthetic.check_int("blocksworld", "max_steps", max_steps, 1)
      if max_steps < min_steps:
        raise ValueError(
            f"blocksworld: max_steps={max_steps} is below min_steps={min_steps}"
        )
    self.names = COLORS[:num_blocks]
    self.min_steps, self.max_steps = min_steps, max_steps
    super().__init__(test_size=test_size, **kwargs)

  def generator_config(self) -> dict[str, Any]:
    return {
        "num_blocks": len(self.names),
        "min_steps": self.min_steps,
        "max_steps": self.max_steps,
    }

  def _draw(self, rng: random.Random) -> tuple[str, tuple] | None:
    init = state_from_stacks(random_stacks(rng, self.names))
    target = state_from_stacks(random_stacks(rng, self.names))
    goal = sorted(f for f in target if f[0] == "on")
    return (problem_key(init, goal), (init, goal)) if goal else None

  def _record(self, key: str, drawn: tuple) -> dict[str, Any] | None:
    del key
    init, goal = drawn
    plan = optimal_plan(init, goal)
    hi = self.max_steps if self.max_steps is not None else len(plan)
    if not self.min_steps <= len(plan) <= hi:
      return None
    return {
        "init": sorted(list(f) for f in init),
        "goal": [list(f) for f in goal],
        "plan": [list(a) for a in plan],
    }

  def _uid(self, key: str, index: int) -> str:
    del index
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"bw{len(self.names)}-{digest}"

  def _example(self, record: dict[str, Any]) -> base.Example:
    init = frozenset(tuple(f) for f in record["init"])
    goal = [tuple(f) for f in record["goal"]]
    goal_text = ", ".join(f"{g[1]} on {g[2]}" for g in goal)
    prompt = (
        f"Blocks world. Start: {describe(init)}, hand empty.\n"
        f"Goal: {goal_text}.\n"
        "Write the plan, one action per line: (pick-up X), (put-down X), "
        f"(stack X Y) or (unstack X Y). End with {PLAN_END}."
    )
    return base.Example(
        uid=record["uid"],
        prompt=prompt,
        target={"init": record["init"], "goal": record["goal"]},
        meta={
            "reference_plan": plan_text([tuple(a) for a in record["plan"]]),
            "optimal_length": len(record["plan"]),
            "num_blocks": len(self.names),
        },
    )

  def extract_answer(self, text: str) -> str | None:
    plan = parse_plan(text, COLORS)
    return plan_text(plan) if plan else None

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    result = validate(
        example.target["init"], example.target["goal"], parse_plan(answer)
    )
    return base.Verdict(
        float(result.valid), result.valid, answer, result.reason
    )

  def demonstration(self, example: base.Example) -> str:
    return f"{example.meta['reference_plan']}\n{PLAN_END}"
