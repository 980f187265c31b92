"""AR-Bench Situation Puzzles (`arbench_sp`): ask yes/no, tell the story.

The team sees `surface` (sp/test.json) and asks yes/no questions ("Q:
<question>"); a referee responder that knows `bottom` answers Yes, No or
Unknown. The episode ends with "Final answer: <explanation>" (once the
questions run out, the next message is the explanation, tagged or not).
AR-Bench logs two F1 scores between the explanation and `bottom`, both with
its bag-of-tokens F1 (shared tokens counted with multiplicity):

  P = |pred ∩ gold| / |pred|,  R = |pred ∩ gold| / |gold|,  F1 = 2PR/(P+R)

over characters (`char_f1`) and over whitespace-split words (`word_f1`).
The reward is word F1: character bags of any two English texts overlap
heavily (each SP `bottom` against the next puzzle's: char F1 0.85 on average,
word F1 0.25, at most 0.44), so char F1 hardly separates answers. `correct`
is word F1 >= `correct_threshold` (default 0.5, above every unrelated pair);
both F1s are in the verdict's reason.
AR-Bench's LLM-judged key-point and process scores are not reproduced.
"""

import collections
import os
import re
from typing import Any, Sequence

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import arbench
from sat_jax.tasks import base
from sat_jax.tasks import files
from sat_jax.tasks import registry
from sat_jax.tasks import responder as responder_lib

_FINAL_RE = re.compile(r"final answer\s*:\s*(.+)", re.IGNORECASE | re.DOTALL)


def f1(prediction: Sequence[Any], reference: Sequence[Any]) -> float:
  """AR-Bench's F1 of two token sequences (bags with multiplicity)."""
  same = sum(
      (
          collections.Counter(prediction) & collections.Counter(reference)
      ).values()
  )
  if same == 0:
    return 0.0
  precision, recall = same / len(prediction), same / len(reference)
  return 2 * precision * recall / (precision + recall)


def char_f1(prediction: str, reference: str) -> float:
  return f1(list(prediction), list(reference))


def word_f1(prediction: str, reference: str) -> float:
  return f1(prediction.split(), reference.split())


def extract_explanation(text: str) -> str | None:
  """Everything after the first "Final answer:", stripped."""
  m = _FINAL_RE.search(text)
  return m[1].strip() if m else None


def _referee_reply(text: str) -> str:
  """Yes / No / Unknown when the reply starts with one, else the reply."""
  words = re.findall(r"[a-z]+", text.lower())
  canon = {
      "yes": "Yes",
      "no": "No",
      "unknown": "Unknown",
      "irrelevant": "Unknown",
  }
  return canon[words[0]] if words and words[0] in canon else text.strip()[:300]


class PuzzleEnv(arbench.ResponderEnv):
  """An SP puzzle: a referee answers yes/no questions; F1 scores the story."""

  kind = "arbench_sp"
  final_hint = "Final answer: <the full story>"

  def __init__(
      self,
      surface: str,
      bottom: str,
      responder: responder_lib.Responder,
      max_turns: int,
      threshold: float = 0.5,
  ):
    self.surface, self.bottom, self.threshold = surface, bottom, threshold
    self.facts = (
        "You referee a situation puzzle. The player sees only the puzzle and "
        "asks yes/no questions about the hidden story. Answer each question "
        "with exactly one word: Yes (it agrees with the story), No (it "
        "contradicts it) or Unknown (the story does not say).\n"
        f"Puzzle: {surface}\nHidden story: {bottom}"
    )
    super().__init__(responder, max_turns)

  def _final(self, message: str) -> str | None:
    final = extract_explanation(message)
    if final is None and self.awaiting_final:
      return message.strip()  # the last message is the answer, tagged or not
    return final

  def _turn(self, message: str) -> str:
    question = re.split(r"\bQ\s*:", message)[-1].strip()
    if not question:
      return "Ask one yes/no question: 'Q: <question>'."
    reply = self.responder.reply(self.facts, question, self.history["referee"])
    reply = _referee_reply(reply)
    self.history["referee"].append((question, reply))
    return reply

  def verdict(self) -> base.Verdict:
    if not self.answer:
      return base.Verdict(0.0, False, self.answer, "no final answer")
    return sp_verdict(self.answer, self.bottom, self.threshold)


def sp_verdict(explanation: str, bottom: str, threshold: float) -> base.Verdict:
  word, char = word_f1(explanation, bottom), char_f1(explanation, bottom)
  ok = word >= threshold
  return base.Verdict(
      word, ok, explanation, f"word F1 {word:.3f}, char F1 {char:.3f}"
  )


@registry.register("arbench_sp")
class SituationPuzzlesTask(arbench.ArBenchTask):
  """AR-Bench SP: ask yes/no questions, then explain the hidden story."""

  name = "arbench_sp"
  subdir = "sp"

  def __init__(
      self,
      path: str | os.PathLike,
      responder: responder_lib.Responder | str | os.PathLike | None = None,
      max_turns: int = 25,
      correct_threshold: float = 0.5,
  ):
    if not 0.0 <= correct_threshold <= 1.0:
      raise ValueError(
          f"correct_threshold must be in [0, 1]: {correct_threshold}"
      )
    super().__init__(path, responder, max_turns)
    self.threshold = correct_threshold

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    examples = []
    for i, item, where in self._items():
      files.require_fields(item, ("surface", "bottom"), where)
      if not (
          isinstance(item["surface"], str) and isinstance(item["bottom"], str)
      ):
        raise DataFileError(f"{where}: surface and bottom must be strings")
      prompt = (
          "Solve this situation puzzle by asking yes/no questions.\n"
          f"Puzzle: {item['surface']}\n"
          "Ask one question per turn as 'Q: <question>'; I answer Yes, No or "
          f"Unknown. You have {self.max_turns} questions. Then reply "
          "'Final answer: <what happened, in full>'."
      )
      examples.append(
          base.Example(
              uid=f"arbench-sp-{i}",
              prompt=prompt,
              target={"surface": item["surface"], "bottom": item["bottom"]},
              meta={
                  "key_question": item.get("key_question", []),
                  "index": item.get("index"),
              },
          )
      )
    return examples

  def extract_answer(self, text: str) -> str | None:
    return extract_explanation(text)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    return sp_verdict(answer, example.target["bottom"], self.threshold)

  def answer_key(self, answer: str) -> str:
    return " ".join(answer.lower().split())

  def make_environment(self, example: base.Example) -> PuzzleEnv:
    t = example.target
    return PuzzleEnv(
        t["surface"],
        t["bottom"],
        self.responder,
        self.max_turns,
        self.threshold,
    )
