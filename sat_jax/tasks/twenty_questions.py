"""Twenty questions over an attribute table, answered by an exact oracle.

A problem is a small table of items (name plus attribute values) shown in the
prompt, and one hidden item. The team asks yes/no questions in a constrained
form the oracle answers exactly from the hidden item's row:

  "Is it red?" / "Is it round?" / "Is it wood?"   a categorical value
  "Is its weight > 3?"  (also <, =, >=, <=)       a numeric comparison
                                                  (3.5 too: compared exactly)
  "Is it cup?"                                    a guess of one item

The last such question in a message is answered "Yes." or "No."; a message
with none gets a reminder of the forms. Either way it uses a turn. "Final
answer: cup" (or "[cup]") ends the episode; after `max_turns` questions the
oracle asks for the final answer and the next message ends it. Correct iff
the final answer names the hidden item (reward 1, else 0).

Values of different attributes are disjoint words, so a value names its
attribute. A value of an attribute in play that no item has is answered "No."
(it is exact: the hidden item does not have it). Difficulty grows with the
number of items and attributes and shrinks with the turn budget. The scripted
policy of `demonstration_messages` asks the question that splits the
remaining candidates most evenly.
"""

import json
import random
import re
from typing import Any, Mapping, Sequence

from sat_jax.tasks import base
from sat_jax.tasks import datasets
from sat_jax.tasks import episodes
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic

VALUES = {
    "color": ("red", "blue", "green", "yellow", "black", "white"),
    "weight": tuple(range(1, 10)),
    "shape": ("round", "square", "long", "flat"),
    "material": ("wood", "metal", "glass", "cloth"),
}
ATTRIBUTES = tuple(VALUES)  # the first `num_attributes` are used
NAMES = (
    "cup", "key", "ball", "box", "pen", "hat", "lamp", "book",
    "sock", "fork", "ring", "bell", "coin", "drum", "kite", "vase",
)  # fmt: skip
FORMS = (
    "I can only answer: 'Is it <value>?', 'Is its weight > <number>?' "
    "(or <, =) or 'Is it <item>?'."
)
# The threshold may be a decimal ("> 3.5"): reading only its integer part
# would answer a different question than the one asked.
_NUMERIC_Q = r"is its (\w+)\s*(>=|<=|>|<|=)\s*(-?(?:\d+(?:\.\d+)?|\.\d+))"
_WORD_Q = r"is it (?:an? |made of )?(\w+)\s*\?"
# The prompt and the final hint show the form "Final answer: [item]", so a
# bracketed name is read as well as a bare one.
_FINAL = r"final answer\s*:\s*\[?\s*(?:the |an? )?(\w+)\s*\]?"
_OPS = {
    ">": lambda a, b: a > b, "<": lambda a, b: a < b, "=": lambda a, b: a == b,
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b,
}  # fmt: skip


def _number(text: str) -> int | float:
  """An int when `text` is one (so "3" keeps reading as 3), else a float."""
  try:
    return int(text)
  except ValueError:
    return float(text)


def last_question(text: str) -> tuple | None:
  """("num", attr, op, value) or ("word", w) of the last question in `text`."""
  found = [
      (m.start(), ("num", m[1].lower(), m[2], _number(m[3])))
      for m in re.finditer(_NUMERIC_Q, text, re.IGNORECASE)
  ]
  found += [
      (m.start(), ("word", m[1].lower()))
      for m in re.finditer(_WORD_Q, text, re.IGNORECASE)
  ]
  return max(found, key=lambda f: f[0])[1] if found else None


def extract_final(text: str) -> str | None:
  found = re.findall(_FINAL, text, re.IGNORECASE)
  return found[-1].lower() if found else None


def answer(
    question: tuple, row: Mapping[str, Any], name: str, table_names: Sequence
) -> bool | None:
  """The oracle's truth value for the hidden item; None if unanswerable."""
  if question[0] == "num":
    _, attr, op, value = question
    if attr not in row or not isinstance(row[attr], int):
      return None
    return _OPS[op](row[attr], value)
  word = question[1]
  if word in table_names:
    return word == name
  for attr, value in row.items():
    if word in VALUES[attr] and isinstance(value, str):
      return value == word
  return None


class TwentyQuestionsEnv(episodes.TurnBudgetEnv):
  """One game: find `hidden` among `items` ({name: {attribute: value}})."""

  kind = "twenty_questions"
  final_hint = "Final answer: [item]"

  def __init__(
      self, items: Mapping[str, Mapping[str, Any]], hidden: str, max_turns: int
  ):
    if hidden not in items:
      raise ValueError(f"hidden item {hidden!r} is not in the table")
    self.items, self.hidden = items, hidden
    super().__init__(max_turns)

  def reset(self) -> str | None:
    self.history: list[tuple[tuple | None, bool | None]] = []
    return super().reset()

  def _final(self, message: str) -> str | None:
    return extract_final(message)

  def _closing(self) -> str:
    return "Correct." if self.answer == self.hidden else "Wrong."

  def _turn(self, message: str) -> str:
    question = last_question(message)
    truth = None
    if question is not None:
      row = self.items[self.hidden]
      truth = answer(question, row, self.hidden, list(self.items))
    self.history.append((question, truth))
    return FORMS if truth is None else ("Yes." if truth else "No.")

  def verdict(self) -> base.Verdict:
    if self.answer == self.hidden:
      return base.Verdict(1.0, True, self.answer)
    why = "no final answer" if self.answer is None else "wrong item"
    return base.Verdict(0.0, False, self.answer, why)


def _questions(
    items: Mapping[str, Mapping[str, Any]],
) -> list[tuple[str, tuple]]:
  """(text, parsed) of every question that can split the table."""
  out = []
  for attr in next(iter(items.values())):
    values = sorted({row[attr] for row in items.values()})
    if attr == "weight":
      out += [(f"Is its weight > {v}?", ("num", attr, ">", v)) for v in values]
    else:
      out += [(f"Is it {v}?", ("word", v)) for v in values]
  return out


def scripted_policy(
    items: Mapping[str, Mapping[str, Any]],
    candidates: Sequence[str],
    must_answer: bool,
) -> str:
  """The most even split of the candidates; a final answer when sure."""
  if len(candidates) == 1 or must_answer:
    return f"Final answer: {candidates[0]}"
  names = list(items)

  def worst(q):
    yes = sum(bool(answer(q[1], items[c], c, names)) for c in candidates)
    return max(yes, len(candidates) - yes)

  return min(_questions({c: items[c] for c in candidates}), key=worst)[0]


@registry.register("twenty_questions")
class TwentyQuestionsTask(synthetic.SampledTask):
  """Synthetic question asking: identify the hidden item of a table.

  `max_turns` shapes only the prompt and the environment, so it does not key
  the stored data.
  """

  name = "twenty_questions"

  def __init__(
      self,
      num_items: int = 6,
      num_attributes: int = 3,
      max_turns: int = 6,
      *,
      train_size: int = 2000,
      **kwargs,
  ):
    for field, value, lo, hi in (
        ("num_items", num_items, 2, len(NAMES)),
        ("num_attributes", num_attributes, 1, len(ATTRIBUTES)),
        ("max_turns", max_turns, 1, None),
    ):
      synthetic.check_int("twenty_questions", field, value, lo, hi)
    self.attributes = ATTRIBUTES[:num_attributes]
    distinct = 1
    for attr in self.attributes:
      distinct *= len(VALUES[attr])
    if distinct < num_items:
      raise ValueError(
          f"{num_attributes} attribute(s) give only {distinct} distinct rows, "
          f"fewer than num_items={num_items}"
      )
    self.num_items, self.max_turns = num_items, max_turns
    super().__init__(train_size=train_size, **kwargs)

  def generator_config(self) -> dict[str, Any]:
    return {
        "num_items": self.num_items,
        "num_attributes": len(self.attributes),
    }

  def _draw(self, rng: random.Random) -> tuple[str, dict[str, Any]]:
    names = rng.sample(NAMES, self.num_items)
    rows: set[tuple] = set()
    while len(rows) < len(names):
      rows.add(tuple(rng.choice(VALUES[a]) for a in self.attributes))
    table = [
        [n, *r] for n, r in zip(names, rng.sample(sorted(rows), len(rows)))
    ]
    hidden = rng.choice(names)
    key = json.dumps([sorted(table), hidden])
    return key, {"table": table, "hidden": hidden}

  def _uid(self, key: str, index: int) -> str:
    return f"tq-{index}-{datasets.config_key({'k': key})}"

  def items(self, example: base.Example) -> dict[str, dict[str, Any]]:
    return {
        row[0]: dict(zip(self.attributes, row[1:]))
        for row in example.target["table"]
    }

  def _example(self, record: dict[str, Any]) -> base.Example:
    rows = "; ".join(
        f"{r[0]} ({', '.join(str(v) for v in r[1:])})" for r in record["table"]
    )
    prompt = (
        "Find my hidden item by yes/no questions.\n"
        f"Items ({', '.join(self.attributes)}): {rows}.\n"
        "Ask one question per turn, like 'Is it red?' or 'Is its weight > 3?'. "
        f"{self.max_turns} questions, then reply 'Final answer: [item]'."
    )
    target = {"table": record["table"], "hidden": record["hidden"]}
    return base.Example(
        record["uid"], prompt, target, {"max_turns": self.max_turns}
    )

  def extract_answer(self, text: str) -> str | None:
    return extract_final(text)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    ok = answer.strip().lower() == example.target["hidden"]
    return base.Verdict(float(ok), ok, answer, "" if ok else "wrong item")

  def make_environment(self, example: base.Example) -> TwentyQuestionsEnv:
    return TwentyQuestionsEnv(
        self.items(example), example.target["hidden"], self.max_turns
    )

  def demonstration_messages(self, example: base.Example) -> list[dict]:
    """The prompt, then a scripted game (assistant = team, user = oracle)."""
    env = self.make_environment(example)
    items, candidates = env.items, list(env.items)

    def policy() -> str:
      nonlocal candidates
      question, truth = env.history[-1] if env.history else (None, None)
      if truth is not None:
        candidates = [
            c for c in candidates
            if answer(question, items[c], c, list(items)) == truth
        ]  # fmt: skip
      return scripted_policy(items, candidates, env.awaiting_final)

    return episodes.scripted_episode(example.prompt, env, policy)

  def demonstration(self, example: base.Example) -> str:
    return f"Final answer: {example.target['hidden']}"
