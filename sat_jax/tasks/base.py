"""The task interface: examples, answer extraction, verifiers, environments.

Every domain (math, logic, planning, active reasoning) and every real benchmark
implements `Task`. Team rollouts (`sat_jax.team`) and evaluation
(`sat_jax.eval`) only talk to this interface:

  1. `task.load(split)` gives `Example`s; `example.prompt` is the user turn.
  2. The team talks; for a multi-turn task, `task.make_environment(example)`
     returns an `Environment` whose replies are put in the transcript between
     team turns (`sat_jax.tasks.episodes` has the shared turn budget).
  3. The team answer (per protocol) is scored with `score_text` (single-turn)
     or `environment.verdict()` (multi-turn). `task.answer_key` canonicalises
     answers for majority voting.

A verifier that raises is never allowed to crash a run: `score_text` turns the
exception into a wrong `Verdict` whose reason names it, and logs it.
"""

import abc
import dataclasses
from typing import Any, Hashable, Mapping, Sequence

from absl import logging


@dataclasses.dataclass(frozen=True)
class Example:
  """One problem. `target` is the gold answer or instance data (JSON-able)."""

  uid: str
  prompt: str
  target: Any
  meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The score of one answer: reward in [0, 1] and whether it is correct."""

  reward: float
  correct: bool
  answer: str | None = None  # the extracted answer, None when none was found
  reason: str = ""  # why it is wrong (empty when correct)


@dataclasses.dataclass(frozen=True)
class EnvReply:
  """An environment's answer to one team message."""

  text: str | None  # the message put in the transcript (None: say nothing)
  done: bool  # the episode is over (solved, or out of turns)


class Environment(abc.ABC):
  """A multi-turn environment for one example (e.g. guess-the-number)."""

  @abc.abstractmethod
  def reset(self) -> str | None:
    """Starts the episode; returns the first environment message, if any."""

  @abc.abstractmethod
  def step(self, message: str) -> EnvReply:
    """Answers one team message."""

  @abc.abstractmethod
  def verdict(self) -> Verdict:
    """Scores the episode so far (called when it ends)."""


class Task(abc.ABC):
  """A verifiable task: a source of examples plus its verifier."""

  name: str = ""
  # Instructions prepended as a system turn (None: no system turn).
  system_prompt: str | None = None

  @abc.abstractmethod
  def load(self, split: str) -> Sequence[Example]:
    """The examples of `split` (e.g. "train", "test")."""

  @abc.abstractmethod
  def extract_answer(self, text: str) -> str | None:
    """The answer stated in a message, or None if it states none."""

  @abc.abstractmethod
  def check(self, example: Example, answer: str) -> Verdict:
    """Scores an extracted answer against the example."""

  def answer_key(self, answer: str) -> Hashable:
    """Canonical form of an answer: equal keys are the same vote."""
    return " ".join(answer.split())

  def make_environment(self, example: Example) -> Environment | None:
    """The environment of a multi-turn task; None for single-turn tasks."""
    del example
    return None

  def demonstration(self, example: Example) -> str:
    """A correct answer message for `example` (for supervised warm start)."""
    raise ValueError(f"task {self.name!r} provides no demonstrations")

  def demonstration_messages(self, example: Example) -> list[dict[str, Any]]:
    """A correct episode as chat messages (for supervised warm start).

    The conversation after the system turn: the user prompt, then the team's
    messages (assistant) and the environment's replies (user). This default
    is the single-turn episode `[user: prompt, assistant: demonstration]`;
    multi-turn tasks play a scripted episode instead.
    """
    return [
        message("user", example.prompt),
        message("assistant", self.demonstration(example)),
    ]


def score_text(task: Task, example: Example, text: str) -> Verdict:
  """Extracts and checks the answer in `text`; never raises for bad answers."""
  try:
    answer = task.extract_answer(text)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning(
        "%s/%s: answer extraction raised %r", task.name, example.uid, e
    )
    return Verdict(
        0.0, False, None, f"extractor error: {type(e).__name__}: {e}"
    )
  if answer is None:
    return Verdict(0.0, False, None, "no answer found")
  try:
    return task.check(example, answer)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning(
        "%s/%s: verifier raised %r on %r", task.name, example.uid, e, answer
    )
    return Verdict(
        0.0, False, answer, f"verifier error: {type(e).__name__}: {e}"
    )


def safe_verdict(task: Task, example: Example, env: Environment) -> Verdict:
  """`env.verdict()`, with an exception turned into a wrong verdict."""
  try:
    return env.verdict()
  except Exception as e:  # pylint: disable=broad-except
    logging.warning(
        "%s/%s: environment verdict raised %r", task.name, example.uid, e
    )
    return Verdict(0.0, False, None, f"verifier error: {type(e).__name__}: {e}")


def majority(keys: Sequence[Hashable]) -> int:
  """Index of the first item whose key is the most frequent (ties: earliest)."""
  if not keys:
    raise ValueError("majority of an empty list")
  counts: dict[Hashable, int] = {}
  for k in keys:
    counts[k] = counts.get(k, 0) + 1
  best = max(counts.values())
  return next(i for i, k in enumerate(keys) if counts[k] == best)


def check_split(split: str, allowed: Sequence[str]) -> None:
  if split not in allowed:
    raise ValueError(
        f"unknown split {split!r}; expected one of {list(allowed)}"
    )


def message(role: str, content: str, name: str | None = None) -> dict[str, Any]:
  """A chat message in the transformers chat-template format."""
  m: dict[str, Any] = {"role": role, "content": content}
  if name is not None:
    m["name"] = name
  return m
