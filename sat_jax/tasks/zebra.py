"""Zebra grid puzzles: clues, an exact solver, a generator, the task.

A puzzle has `houses` houses (1 = leftmost) and `attributes` attributes (Name
plus others); each attribute takes each of its values in exactly one house.
Clues are ZebraLogic's kinds: found_at / not_at (X is / is not in house k),
same_house / not_same_house (X is / is not Y), left_of / right_of (somewhere),
directly_left, next_to, one_between. The generator draws true clues until the
exact solver (bitmask constraint propagation plus backtracking) finds exactly
one solution, then drops every clue whose removal keeps it unique, so each
stored puzzle is unique and clue-minimal.

Answers are scored as ZebraLogic grids (`zebra_grid.GridScoring`): reward =
puzzle correctness, cell accuracy through `extra_scores`.
"""

import dataclasses
import json
import random
from typing import Any, Mapping, Sequence

from sat_jax.tasks import base
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic
from sat_jax.tasks import zebra_grid

# attribute -> (values, noun phrase of the person with a value)
POOLS: dict[str, tuple[tuple[str, ...], str]] = {
    "Name": (("Alice", "Bob", "Carol", "David", "Eric", "Fiona"), "{}"),
    "Color": (
        ("red", "green", "blue", "white", "yellow", "black"),
        "the person in the {} house",
    ),
    "Pet": (("cat", "dog", "bird", "fish", "horse", "rabbit"), "the {} owner"),
    "Drink": (
        ("tea", "coffee", "milk", "water", "juice", "soda"),
        "the {} drinker",
    ),
    "Hobby": (
        ("chess", "tennis", "painting", "reading", "hiking", "cooking"),
        "the person who likes {}",
    ),
    "Food": (
        ("pizza", "pasta", "rice", "soup", "salad", "bread"),
        "the person who eats {}",
    ),
}
MAX_SIZE = 6

# kind -> (relation on 0-based houses (hx, hy), sentence template, weight)
_PAIR_KINDS = {
    "same_house": (lambda a, b: a == b, "{x} is {y}.", 3),
    "not_same_house": (lambda a, b: a != b, "{x} is not {y}.", 1),
    "left_of": (lambda a, b: a < b, "{x} is somewhere left of {y}.", 1),
    "right_of": (lambda a, b: a > b, "{x} is somewhere right of {y}.", 1),
    "directly_left": (
        lambda a, b: a + 1 == b,
        "{x} is directly left of {y}.",
        2,
    ),
    "next_to": (
        lambda a, b: abs(a - b) == 1,
        "{x} and {y} are next to each other.",
        2,
    ),
    "one_between": (
        lambda a, b: abs(a - b) == 2,
        "There is one house between {x} and {y}.",
        1,
    ),
}
_HOUSE_KINDS = {
    "found_at": (lambda h, k: h == k, "{x} is in house {k}.", 1),
    "not_at": (lambda h, k: h != k, "{x} is not in house {k}.", 1),
}
Var = tuple[str, str]  # (attribute, value)


@dataclasses.dataclass(frozen=True)
class Clue:
  """One clue; `house` is 1-based (found_at / not_at), else `y` is set."""

  kind: str
  x: Var
  y: Var | None = None
  house: int | None = None

  def render(self) -> str:
    phrase = lambda v: POOLS[v[0]][1].format(v[1]) if v[0] in POOLS else v[1]
    if self.kind in _HOUSE_KINDS:
      text = _HOUSE_KINDS[self.kind][1].format(x=phrase(self.x), k=self.house)
    else:
      text = _PAIR_KINDS[self.kind][1].format(
          x=phrase(self.x), y=phrase(self.y)
      )
    return text[0].upper() + text[1:]

  def to_json(self) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> "Clue":
    y = tuple(d["y"]) if d.get("y") is not None else None
    return cls(d["kind"], tuple(d["x"]), y, d.get("house"))


def holds(clue: Clue, house_of: Mapping[Var, int]) -> bool:
  """Whether `clue` is true when variable v sits in 0-based house_of[v]."""
  if clue.kind in _HOUSE_KINDS:
    return _HOUSE_KINDS[clue.kind][0](house_of[clue.x], clue.house - 1)
  return _PAIR_KINDS[clue.kind][0](house_of[clue.x], house_of[clue.y])


def solve(
    houses: int,
    attributes: Mapping[str, Sequence[str]],
    clues: Sequence[Clue],
    limit: int = 2,
) -> list[dict[Var, int]]:
  """Up to `limit` solutions (maps variable -> 0-based house), exactly.

  Domains are bitmasks over houses. Propagation to a fixed point: unary
  clues once; each pair clue keeps the houses with a support in the other
  domain; per attribute, an assigned house leaves the other values, and a
  house that only one value can take is assigned. Then branch on the
  smallest open domain.
  """
  names = [(a, v) for a, vs in attributes.items() for v in vs]
  index = {v: i for i, v in enumerate(names)}
  full = (1 << houses) - 1
  dom = [full] * len(names)
  groups = [[index[(a, v)] for v in vs] for a, vs in attributes.items()]
  pairs = []
  for c in clues:
    if c.kind in _HOUSE_KINDS:
      k = c.house - 1
      dom[index[c.x]] &= (1 << k) if c.kind == "found_at" else full & ~(1 << k)
      continue
    rel = _PAIR_KINDS[c.kind][0]
    sup_xy = [
        sum(1 << b for b in range(houses) if rel(a, b)) for a in range(houses)
    ]
    sup_yx = [
        sum(1 << a for a in range(houses) if rel(a, b)) for b in range(houses)
    ]
    pairs.append((index[c.x], index[c.y], sup_xy, sup_yx))

  def supported(d_from: int, sup: list[int]) -> int:
    m = 0
    for h in range(houses):
      if d_from >> h & 1:
        m |= sup[h]
    return m

  def propagate(d: list[int]) -> bool:
    changed = True
    while changed:
      changed = False
      for x, y, sup_xy, sup_yx in pairs:
        for a, b, sup in ((x, y, sup_xy), (y, x, sup_yx)):
          new = d[b] & supported(d[a], sup)
          if new != d[b]:
            d[b], changed = new, True
      for g in groups:
        for i in g:
          if d[i] == 0:
            return False
          if d[i] & (d[i] - 1) == 0:  # Singleton: nobody else there.
            for j in g:
              if j != i and d[j] & d[i]:
                d[j] &= ~d[i]
                changed = True
        for h in range(houses):
          holders = [i for i in g if d[i] >> h & 1]
          if not holders:
            return False
          if len(holders) == 1 and d[holders[0]] != 1 << h:
            d[holders[0]] = 1 << h
            changed = True
    return True

  found: list[dict[Var, int]] = []

  def search(d: list[int]) -> None:
    if len(found) >= limit or not propagate(d):
      return
    open_vars = [i for i in range(len(d)) if d[i] & (d[i] - 1)]
    if not open_vars:
      found.append({names[i]: d[i].bit_length() - 1 for i in range(len(d))})
      return
    i = min(open_vars, key=lambda j: bin(d[j]).count("1"))
    for h in range(houses):
      if d[i] >> h & 1:
        child = list(d)
        child[i] = 1 << h
        search(child)

  search(dom)
  return found


def _random_clue(rng: random.Random, house_of: Mapping[Var, int], houses: int):
  """A random clue that is true in the solution, or None if none was found."""
  kinds = {**_PAIR_KINDS, **_HOUSE_KINDS}
  kind = rng.choices(list(kinds), weights=[k[2] for k in kinds.values()])[0]
  x = rng.choice(list(house_of))
  if kind in _HOUSE_KINDS:
    ks = [
        k
        for k in range(1, houses + 1)
        if _HOUSE_KINDS[kind][0](house_of[x], k - 1)
    ]
    return Clue(kind, x, house=rng.choice(ks)) if ks else None
  rel = _PAIR_KINDS[kind][0]
  ys = [
      y
      for y in house_of
      if y != x and rel(house_of[x], house_of[y])
      # A pair within one attribute is only informative for positions.
      and (y[0] != x[0] or kind not in ("same_house", "not_same_house"))
  ]
  return Clue(kind, x, y=rng.choice(ys)) if ys else None


def generate_puzzle(
    rng: random.Random, houses: int, num_attributes: int
) -> tuple[dict[str, list[str]], list[Clue], dict[Var, int]]:
  """(attributes, clue-minimal clues with a unique solution, that solution)."""
  others = rng.sample([a for a in POOLS if a != "Name"], num_attributes - 1)
  attributes = {
      a: sorted(rng.sample(POOLS[a][0], houses)) for a in ["Name"] + others
  }
  house_of = {}
  for a, values in attributes.items():
    for h, v in enumerate(rng.sample(values, houses)):
      house_of[(a, v)] = h
  clues: list[Clue] = []
  while len(solve(houses, attributes, clues)) > 1:
    clue = _random_clue(rng, house_of, houses)
    if clue is not None and clue not in clues:
      clues.append(clue)
  # Drop, in random order, every clue the others already imply.
  order = list(range(len(clues)))
  rng.shuffle(order)
  keep = [True] * len(clues)
  for i in order:
    keep[i] = False
    trial = [c for c, k in zip(clues, keep) if k]
    if len(solve(houses, attributes, trial)) != 1:
      keep[i] = True
  clues = [c for c, k in zip(clues, keep) if k]
  rng.shuffle(clues)
  return attributes, clues, house_of


def solution_table(
    houses: int,
    attributes: Mapping[str, Sequence[str]],
    house_of: Mapping[Var, int],
) -> dict[str, list]:
  """ZebraLogic's `{"header": ["House", ...], "rows": [["1", ...], ...]}`."""
  rows = [[str(h + 1)] for h in range(houses)]
  for a, values in attributes.items():
    for v in values:
      rows[house_of[(a, v)]].append(v)
  return {"header": ["House", *attributes], "rows": rows}


@registry.register("zebra")
class ZebraTask(zebra_grid.GridScoring, synthetic.SampledTask):
  """Zebra puzzles of `houses` x `attributes` (2..6 each), unique answers."""

  name = "zebra"
  system_prompt = (
      'Answer with JSON: {"solution": {"House 1": {"<attribute>": "<value>",'
      " ...}, ...}} covering every house and attribute."
  )

  def __init__(self, *, houses: int = 3, attributes: int = 3, **kwargs):
    synthetic.check_int("zebra", "houses", houses, 2, MAX_SIZE)
    synthetic.check_int("zebra", "attributes", attributes, 2, MAX_SIZE)
    self.houses = houses
    self.attributes = attributes
    super().__init__(**kwargs)

  def generator_config(self) -> dict[str, Any]:
    return {"houses": self.houses, "attributes": self.attributes}

  def _draw(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
    attributes, clues, house_of = generate_puzzle(
        rng, self.houses, self.attributes
    )
    table = solution_table(self.houses, attributes, house_of)
    # Keyed by the solution grid: no test grid is ever seen in training.
    key = json.dumps(
        {
            a: [r[j] for r in table["rows"]]
            for j, a in enumerate(table["header"])
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    lines = [
        f"{self.houses} houses, numbered 1 to {self.houses} from left to"
        " right. Each attribute has a different value in each house."
    ]
    lines += [f"{a}: {', '.join(vs)}" for a, vs in attributes.items()]
    lines.append("Clues:")
    lines += [f"{i}. {c.render()}" for i, c in enumerate(clues, 1)]
    record = {
        "prompt": "\n".join(lines),
        "target": table,
        "meta": {
            "size": f"{self.houses}*{self.attributes}",
            # Pairs: the stored JSON sorts object keys, lists keep order.
            "attributes": [[a, vs] for a, vs in attributes.items()],
            "clues": [c.to_json() for c in clues],
        },
    }
    return key, record

  def demonstration(self, example: base.Example) -> str:
    header, rows = example.target["header"], example.target["rows"]
    grid = {f"House {r[0]}": dict(zip(header[1:], r[1:])) for r in rows}
    return json.dumps({"solution": grid})
