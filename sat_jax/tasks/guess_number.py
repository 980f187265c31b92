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
(synthetic targets, a `synthetic.SyntheticTask` split by target) and
`arbench_gn` (the AR-Bench test targets from `gn/test.json`, 25 turns).
Multi-turn demonstrations: `demonstration_messages` plays a scripted policy
that always guesses the first number consistent with all feedback so far.
"""

import functools
import itertools
import os
import random
import re
from typing import Any, Sequence

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import base
from sat_jax.tasks import datasets
from sat_jax.tasks import episodes
from sat_jax.tasks import files
from sat_jax.tasks import registry
from sat_jax.tasks import synthetic

STYLES = ("arbench", "compact")
ASK_FORMAT = "Your output does not follow this format: Guess: [number]."


def _check_style(task: str, style: Any) -> None:
  if style not in STYLES:
    raise ValueError(
        f"{task}: feedback_style must be one of {STYLES}, got {style!r}"
    )


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


class GuessNumberEnv(episodes.TurnBudgetEnv):
  """One game against a fixed target."""

  kind = "guess_number"
  turn_noun = "guesses"
  final_hint = "Final answer: [number]"

  def __init__(self, target: str, max_turns: int, style: str = "arbench"):
    if style not in STYLES:
      raise ValueError(f"unknown feedback style {style!r}; expected {STYLES}")
    self.target, self.style = target, style
    super().__init__(max_turns)

  def reset(self) -> str | None:
    self.history: list[tuple[str, int, int]] = []  # (guess or "", x, y)
    return super().reset()

  @property
  def solved(self) -> bool:
    return self.done and self.answer == self.target

  def _final(self, message: str) -> str | None:
    n = len(self.target)
    final = extract_final(message, n)
    if final is None and self.awaiting_final:
      return extract_guess(message, n)
    return final

  def _closing(self) -> str:
    return "Correct." if self.solved else "Wrong."

  def _turn(self, message: str) -> str:
    n = len(self.target)
    guess = extract_guess(message, n)
    if guess is None:
      self.history.append(("", 0, 0))
      return ASK_FORMAT
    x, y = feedback(self.target, guess)
    self.history.append((guess, x, y))
    self.answer = guess
    if x == n:
      self.done = True
      return feedback_text(x, y, self.style) + " Solved."
    return feedback_text(x, y, self.style)

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

  def _game(self, uid: str, target: str) -> base.Example:
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
    """The prompt, then a scripted game (assistant = team, user = env)."""
    env = self.make_environment(example)
    candidates = all_targets(self.num_digits)

    def policy() -> str:
      nonlocal candidates
      if env.history:
        candidates = consistent(candidates, *env.history[-1])
      return scripted_policy(candidates, env.awaiting_final)

    return episodes.scripted_episode(example.prompt, env, policy)

  def demonstration(self, example: base.Example) -> str:
    return f"Final answer: {example.target}"


@registry.register("guess_number")
class GuessNumberTask(_GuessNumberTask, synthetic.SyntheticTask):
  """Synthetic guess-the-number; difficulty = digits and turn budget.

  Every target of `num_digits` distinct digits is enumerated, shuffled by
  the seed, and each split takes the first of its own (by `hash_split` of
  the target); `max_turns` and `feedback_style` shape only the prompt and the
  environment, so they do not key the stored data.
  """

  name = "guess_number"

  def __init__(
      self,
      num_digits: int = 4,
      max_turns: int = 10,
      feedback_style: str = "compact",
      *,
      train_size: int = 2000,
      **kwargs,
  ):
    synthetic.check_int("guess_number", "num_digits", num_digits, 2, 6)
    synthetic.check_int("guess_number", "max_turns", max_turns, 1)
    _check_style("guess_number", feedback_style)
    self.num_digits, self.max_turns = num_digits, max_turns
    self.style = feedback_style
    super().__init__(train_size=train_size, **kwargs)

  def generator_config(self) -> dict[str, Any]:
    return {"num_digits": self.num_digits}

  def records(self, split: str, count: int) -> list[dict[str, Any]]:
    targets = list(all_targets(self.num_digits))
    random.Random(f"guess_number/{self.seed}").shuffle(targets)
    frac = self.test_fraction
    mine = [t for t in targets if datasets.hash_split(t, frac) == split]
    if len(mine) < count:
      raise ValueError(
          f"guess_number: only {len(mine)} {split} targets exist for "
          f"{self.num_digits} digits, {count} asked"
      )
    return [
        {"uid": f"gn{self.num_digits}-{t}", "target": t} for t in mine[:count]
    ]

  def _example(self, record: dict[str, Any]) -> base.Example:
    return self._game(record["uid"], record["target"])


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
    synthetic.check_int("arbench_gn", "max_turns", max_turns, 1)
    _check_style("arbench_gn", feedback_style)
    self.path = files.find_file(path, ("data/gn/test.json", "gn/test.json"))
    self.max_turns, self.style = max_turns, feedback_style

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    examples = []
    for i, target in enumerate(files.read_json_list(self.path)):
      ok = isinstance(target, str) and len(target) == self.num_digits
      if not (ok and target.isdigit() and len(set(target)) == len(target)):
        raise DataFileError(
            f"{self.path}: item {i}: expected a string of "
            f"{self.num_digits} distinct digits, got {target!r}"
        )
      examples.append(self._game(f"arbench-gn-{i}", target))
    return examples
