"""Guess-the-number (AR-Bench GN): feedback rule, environment, data.

The secret is a string of distinct digits (AR-Bench: 4, leading 0 allowed).
AR-Bench's rule (`compare_guess` in its utils): for a guess g and target t,

  x = #{i : g_i = t_i}                       (correct digit, correct place)
  y = sum_d min(count_g(d), count_t(d)) - x   (present, different place)

so a guess with repeated digits counts each target digit at most once.

Episode (`GuessNumberEnv`): each team message is a guess, read from
"Guess: 1234" (else the last standalone number of the right length, as
AR-Bench takes the last 4-digit number), and answered with the feedback. A
message without a guess gets a format reminder and still uses a turn (AR-Bench
counts it too). A correct guess ends the episode as solved. "Final answer:
1234" ends it at once with that answer. After `max_turns` guesses the
environment asks for a final answer, and the next message ends the episode.
The verdict is correct iff the number was found (reward 1, else 0).

Feedback styles: "arbench" uses AR-Bench's wording ("x digits are present in
the answer and in the correct positions, y digits are present in the answer
but in the different positions"); "compact" ("x right place, y wrong place")
says the same in fewer tokens for tiny models. Tasks: `guess_number`
(synthetic targets through `datasets.prepare`, split by target) and
`arbench_gn` (the AR-Bench test targets from `gn/test.json`, 25 turns).
Multi-turn demonstrations: `demonstration_messages` plays a scripted policy
that always guesses the first number consistent with all feedback so far.
"""

import functools
import itertools
import json
import os
import pathlib
import random
import re
from typing import Any, Sequence

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import base
from sat_jax.tasks import blocksworld
from sat_jax.tasks import datasets
from sat_jax.tasks import registry

STYLES = ("arbench", "compact")
ASK_FORMAT = "Your output does not follow this format: Guess: [number]."


def feedback(target: str, guess: str) -> tuple[int, int]:
  """(x, y) of AR-Bench's rule: x in place, y present elsewhere."""
  if len(target) != len(guess):
    raise ValueError(f"guess {guess!r} and target {target!r} differ in length")
  x = sum(a == b for a, b in zip(target, guess))
  common = sum(min(target.count(d), guess.count(d)) for d in set(guess))
  return x, common - x


def feedback_text(x: int, y: int, style: str) -> str:
  if style == "arbench":
    return (
        f"{x} digits are present in the answer and in the correct positions, "
        f"{y} digits are present in the answer but in the different positions."
    )
  return f"{x} right place, {y} wrong place."


def _last(pattern: str, text: str) -> str | None:
  found = re.findall(pattern, text, flags=re.IGNORECASE)
  return found[-1] if found else None


def extract_final(text: str, num_digits: int) -> str | None:
  """The number after the last "Final answer:", if any."""
  return _last(rf"final answer\s*:\s*\[?(\d{{{num_digits}}})(?!\d)", text)


def extract_guess(text: str, num_digits: int) -> str | None:
  """The last "Guess: 1234", else the last standalone n-digit number."""
  tagged = _last(rf"guess\s*:\s*\[?(\d{{{num_digits}}})(?!\d)", text)
  return tagged or _last(rf"(?<!\d)(\d{{{num_digits}}})(?!\d)", text)


@functools.cache
def all_targets(num_digits: int) -> tuple[str, ...]:
  """Every string of `num_digits` distinct digits, in increasing order."""
  return tuple(
      "".join(p) for p in itertools.permutations("0123456789", num_digits)
  )


def consistent(
    candidates: Sequence[str], guess: str, x: int, y: int
) -> list[str]:
  """The candidates that would have answered `guess` with (x, y)."""
  if not guess:  # a turn without a guess tells nothing
    return list(candidates)
  return [t for t in candidates if feedback(t, guess) == (x, y)]


class GuessNumberEnv(base.Environment):
  """One game against a fixed target."""

  def __init__(self, target: str, max_turns: int, style: str = "arbench"):
    if style not in STYLES:
      raise ValueError(f"unknown feedback style {style!r}; expected {STYLES}")
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    self.target, self.max_turns, self.style = target, max_turns, style
    self.reset()

  def reset(self) -> str | None:
    self.history: list[tuple[str, int, int]] = []  # (guess or "", x, y)
    self.done = self.solved = self.awaiting_final = False
    self.answer: str | None = None
    return None

  def step(self, message: str) -> base.EnvReply:
    if self.done:
      raise RuntimeError("guess_number: step() called after the episode ended")
    n = len(self.target)
    final = extract_final(message, n)
    if final is not None or self.awaiting_final:
      self.answer = final if final is not None else extract_guess(message, n)
      self.solved = self.answer == self.target
      self.done = True
      return base.EnvReply("Correct." if self.solved else "Wrong.", True)
    guess = extract_guess(message, n)
    if guess is None:
      self.history.append(("", 0, 0))
      text = ASK_FORMAT
    else:
      x, y = feedback(self.target, guess)
      self.history.append((guess, x, y))
      self.answer = guess
      text = feedback_text(x, y, self.style)
      if x == n:
        self.solved = self.done = True
        return base.EnvReply(text + " Solved.", True)
    if len(self.history) >= self.max_turns:
      self.awaiting_final = True
      text += " No guesses left. Reply with: Final answer: [number]"
    return base.EnvReply(text, False)

  def verdict(self) -> base.Verdict:
    if self.solved:
      return base.Verdict(1.0, True, self.answer)
    if not self.done:
      why = f"not solved after {len(self.history)} guesses"
    else:
      why = f"final answer {self.answer} is not the number"
    return base.Verdict(0.0, False, self.answer, why)


def scripted_policy(candidates: Sequence[str], must_answer: bool) -> str:
  """Guess the first consistent target; a final answer when sure or asked."""
  if len(candidates) == 1 or must_answer:
    return f"Final answer: {candidates[0]}"
  return f"Guess: {candidates[0]}"


class _GuessNumberTask(base.Task):
  """Shared prompt, extraction, environment and demonstrations."""

  num_digits: int = 4
  max_turns: int = 25
  style: str = "arbench"

  def _example(self, uid: str, target: str) -> base.Example:
    n, turns = self.num_digits, self.max_turns
    if self.style == "arbench":
      prompt = (
          f"Let's play a number guessing game. I have a secret {n}-digit "
          "number whose digits are all different. Each turn, guess with "
          "'Guess: [number]'; I reply how many digits are present in the "
          "answer and in the correct positions, and how many are present in "
          f"the answer but in different positions. You have {turns} guesses "
          "and a correct guess wins. You may also end with 'Final answer: "
          "[number]'."
      )
    else:
      prompt = (
          f"Guess my {n}-digit number; its digits are all different. Reply "
          "'Guess: [number]' each turn; I say how many digits are in the right "
          f"place and how many are in it but in the wrong place. {turns} "
          "guesses; a right guess wins, or reply 'Final answer: [number]'."
      )
    return base.Example(uid, prompt, target, {"max_turns": turns})

  def extract_answer(self, text: str) -> str | None:
    n = self.num_digits
    return extract_final(text, n) or extract_guess(text, n)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    if answer == example.target:
      return base.Verdict(1.0, True, answer)
    x, y = feedback(example.target, answer)
    return base.Verdict(0.0, False, answer, f"wrong number ({x} in place, {y})")

  def make_environment(self, example: base.Example) -> GuessNumberEnv:
    return GuessNumberEnv(example.target, self.max_turns, self.style)

  def demonstration_messages(self, example: base.Example) -> list[dict]:
    """A scripted episode as chat messages (assistant = team, user = env)."""
    env = self.make_environment(example)
    candidates, messages = all_targets(self.num_digits), []
    while not env.done:
      move = scripted_policy(candidates, env.awaiting_final)
      reply = env.step(move)
      if env.history and not env.done:
        candidates = consistent(candidates, *env.history[-1])
      messages.append(base.message("assistant", move))
      if reply.text is not None:
        messages.append(base.message("user", reply.text))
    return messages

  def demonstration(self, example: base.Example) -> str:
    return f"Final answer: {example.target}"


@registry.register("guess_number")
class GuessNumberTask(_GuessNumberTask):
  """Synthetic guess-the-number; difficulty = digits and turn budget."""

  name = "guess_number"

  def __init__(
      self,
      num_digits: int = 4,
      max_turns: int = 10,
      feedback_style: str = "compact",
      seed: int = 0,
      train_size: int = 2000,
      test_size: int = 200,
      test_fraction: float = 0.2,
      data_dir: str | os.PathLike | None = None,
  ):
    if not 2 <= num_digits <= 6:
      raise ValueError(f"num_digits must be in [2, 6], got {num_digits}")
    if feedback_style not in STYLES:
      raise ValueError(f"feedback_style must be one of {STYLES}")
    if max_turns < 1 or train_size < 0 or test_size < 0:
      raise ValueError(
          "need max_turns >= 1 and split sizes >= 0, got "
          f"{max_turns}, {train_size}, {test_size}"
      )
    datasets.hash_split("", test_fraction)  # validates the fraction
    self.num_digits, self.max_turns = num_digits, max_turns
    self.style = feedback_style
    self.config = dict(
        num_digits=num_digits, seed=seed, test_fraction=test_fraction
    )
    self.split_sizes = {"train": train_size, "test": test_size}
    self.data_dir = (
        pathlib.Path(data_dir) if data_dir else blocksworld.default_data_dir()
    )
    self._builder = None

  def _records(self, split: str, count: int) -> list[dict[str, Any]]:
    targets = list(all_targets(self.num_digits))
    random.Random(f"guess_number/{self.config['seed']}").shuffle(targets)
    frac = self.config["test_fraction"]
    mine = [t for t in targets if datasets.hash_split(t, frac) == split]
    if len(mine) < count:
      raise ValueError(
          f"guess_number: only {len(mine)} {split} targets exist for "
          f"{self.num_digits} digits, {count} asked"
      )
    return [
        {"uid": f"gn{self.num_digits}-{t}", "target": t} for t in mine[:count]
    ]

  def load(self, split: str) -> list[base.Example]:
    base.check_split(split, ("train", "test"))
    if self._builder is None:
      self._builder = datasets.prepare(
          self.name, self._records, self.split_sizes, self.data_dir, self.config
      )
    records = datasets.load_records(self._builder, split)
    return [self._example(r["uid"], r["target"]) for r in records]


def resolve_path(
    path: str | os.PathLike, relative: Sequence[str]
) -> pathlib.Path:
  """`path` itself if it is a file, else the first `path/<relative>` found."""
  path = pathlib.Path(path).expanduser()
  if path.is_file():
    return path
  for rel in relative:
    if (path / rel).is_file():
      return path / rel
  raise DataFileError(f"{path}: no such file (also tried {list(relative)})")


def read_json(path: pathlib.Path) -> Any:
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise DataFileError(f"{path}: malformed JSON ({e.msg}, line {e.lineno})")
  if not data:
    raise DataFileError(f"{path}: empty file (no items)")
  if not isinstance(data, list):
    raise DataFileError(f"{path}: expected a JSON list of items")
  return data


@registry.register("arbench_gn")
class ArBenchGNTask(_GuessNumberTask):
  """AR-Bench guessing numbers; `path` is gn/test.json or an AR-Bench root."""

  name = "arbench_gn"

  def __init__(
      self,
      path: str | os.PathLike,
      max_turns: int = 25,
      feedback_style: str = "arbench",
  ):
    if feedback_style not in STYLES:
      raise ValueError(f"feedback_style must be one of {STYLES}")
    self.path = resolve_path(path, ("data/gn/test.json", "gn/test.json"))
    self.max_turns, self.style = max_turns, feedback_style

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    examples = []
    for i, target in enumerate(read_json(self.path)):
      ok = isinstance(target, str) and len(target) == self.num_digits
      if not (ok and target.isdigit() and len(set(target)) == len(target)):
        raise DataFileError(
            f"{self.path}: item {i}: expected a string of "
            f"{self.num_digits} distinct digits, got {target!r}"
        )
      examples.append(self._example(f"arbench-gn-{i}", target))
    return examples
