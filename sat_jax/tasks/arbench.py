"""AR-Bench Detective Cases (DC) and Situation Puzzles (SP), multi-turn.

DC (`arbench_dc`, dc/test.json): the team sees the case and five suspects
(A-E in `initial_information` order) and questions them, one question per
turn written "Question for <name>: <question>". Each suspect answers through
the pluggable `Responder` (sat_jax/tasks/responder.py) from its hidden story
and role. After `max_turns` questions (AR-Bench: 25), or at any time, the
team answers "Final answer: <letter>". Score: accuracy, the letter against
`label` (AR-Bench's DC accuracy).

SP (`arbench_sp`, sp/test.json): the team sees `surface` and asks yes/no
questions ("Q: <question>"); a referee responder that knows `bottom` answers
Yes, No or Unknown. The episode ends with "Final answer: <explanation>".
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

import abc
import collections
import os
import re
from typing import Any, Mapping, Sequence

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import base
from sat_jax.tasks import guess_number
from sat_jax.tasks import registry
from sat_jax.tasks import responder as responder_lib

LETTERS = "ABCDEFGHIJ"
_FINAL_LETTER = r"final\s+answer\s*:\s*[\[(]?([A-J])\b"
_ANY_LETTER = (  # AR-Bench's "Answer:"
    r"(?:final\s+)?answer\s*:\s*[\[(]?([A-J])\b"
)


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


def _need(item: Any, fields: Sequence[str], where: str) -> None:
  if not isinstance(item, Mapping):
    raise DataFileError(
        f"{where}: expected an object, got {type(item).__name__}"
    )
  missing = [f for f in fields if f not in item]
  if missing:
    raise DataFileError(f"{where}: missing field(s) {missing}")


def extract_letter(text: str, count: int, lenient: bool = False) -> str | None:
  """The letter of the last "Final answer: X" (also "Answer: X" if lenient)."""
  pattern = _ANY_LETTER if lenient else _FINAL_LETTER
  found = [
      m.upper()
      for m in re.findall(pattern, text, re.IGNORECASE)
      if LETTERS.index(m.upper()) < count
  ]
  return found[-1] if found else None


def route(message: str, names: Sequence[str]) -> tuple[str, str] | None:
  """(suspect, question) of "Question for <name>: <question>", else None.

  The name may be the full name or a part of it that fits one suspect
  ("Fenwick"). Without that form, a message naming exactly one suspect goes
  to that suspect whole.
  """
  m = re.search(r"question\s+(?:for|to)\s+([^:\n]+?)\s*:\s*(.+)", message,
                re.IGNORECASE | re.DOTALL)  # fmt: skip
  if m:
    said, question = m[1].strip().lower(), m[2].strip()
    exact = [n for n in names if n.lower() == said]
    partial = [n for n in names if said in n.lower() or n.lower() in said]
    fits = exact or partial
    if len(fits) == 1 and question:
      return fits[0], question
    return None
  mentioned = [n for n in names if n.lower() in message.lower()]
  if len(mentioned) == 1:
    return mentioned[0], message.strip()
  return None


class _QuestionEnv(base.Environment):
  """Turn budget and the final-answer request shared by DC and SP."""

  kind = "question"
  final_hint = "Final answer: ..."

  def __init__(self, responder: responder_lib.Responder, max_turns: int):
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    self.responder, self.max_turns = responder, max_turns
    self.reset()

  def reset(self) -> str | None:
    self.turns = 0
    self.done = self.awaiting_final = False
    self.answer: str | None = None
    self.history: dict[str, list[tuple[str, str]]] = collections.defaultdict(
        list
    )
    return None

  @abc.abstractmethod
  def _ask(self, message: str) -> str:
    """Answers one question message; returns the reply text."""

  @abc.abstractmethod
  def _final(self, message: str) -> str | None:
    """The final answer stated in `message`, if any."""

  def step(self, message: str) -> base.EnvReply:
    if self.done:
      raise RuntimeError(f"{self.kind}: step() after the episode ended")
    final = self._final(message)
    if final is not None or self.awaiting_final:
      self.answer, self.done = final, True
      return base.EnvReply(None, True)
    text = self._ask(message)
    self.turns += 1
    if self.turns >= self.max_turns:
      self.awaiting_final = True
      text += f" No questions left. Reply with: {self.final_hint}"
    return base.EnvReply(text, False)


class DetectiveEnv(_QuestionEnv):
  """A DC case: route questions to suspects, then score the accused letter."""

  kind = "arbench_dc"

  def __init__(
      self,
      suspects: Sequence[Mapping[str, str]],
      letter: str,
      responder: responder_lib.Responder,
      max_turns: int,
  ):
    self.suspects = {s["name"]: s["facts"] for s in suspects}
    self.names, self.letter = [s["name"] for s in suspects], letter
    self.final_hint = (
        f"Final answer: [{LETTERS[0]}-{LETTERS[len(suspects) - 1]}]"
    )
    super().__init__(responder, max_turns)

  def _final(self, message: str) -> str | None:
    return extract_letter(message, len(self.names), self.awaiting_final)

  def _ask(self, message: str) -> str:
    routed = route(message, self.names)
    if routed is None:
      return "Ask one suspect: 'Question for <full name>: <question>'."
    name, question = routed
    reply = self.responder.reply(
        self.suspects[name], question, self.history[name]
    )
    self.history[name].append((question, reply))
    return f"{name}: {reply}"

  def verdict(self) -> base.Verdict:
    if self.answer == self.letter:
      return base.Verdict(1.0, True, self.answer)
    why = "no final answer" if self.answer is None else "wrong suspect"
    return base.Verdict(0.0, False, self.answer, why)


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


class PuzzleEnv(_QuestionEnv):
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
    m = re.search(
        r"final answer\s*:\s*(.+)", message, re.IGNORECASE | re.DOTALL
    )
    if m:
      return m[1].strip()
    return message.strip() if self.awaiting_final else None

  def _ask(self, message: str) -> str:
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


def _suspect_facts(s: Mapping[str, Any]) -> str:
  return (
      f"You are {s['name']}, a suspect questioned by a detective. Answer in "
      f"one sentence, in character, from your story.\nYour role: {s['task']}\n"
      f"Your story: {s['story']}"
  )


class _ArBenchTask(base.Task):
  """A path, a responder and a turn budget."""

  subdir = ""

  def __init__(
      self,
      path: str | os.PathLike,
      responder: responder_lib.Responder | str | os.PathLike | None = None,
      max_turns: int = 25,
  ):
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    rels = (f"data/{self.subdir}/test.json", f"{self.subdir}/test.json")
    self.path = guess_number.resolve_path(path, rels)
    self.max_turns = max_turns
    self._responder_spec = responder
    self._responder = None

  @property
  def responder(self) -> responder_lib.Responder:
    if self._responder is None:
      self._responder = responder_lib.make_responder(self._responder_spec)
    return self._responder


@registry.register("arbench_dc")
class DetectiveCasesTask(_ArBenchTask):
  """AR-Bench DC: question five suspects, then name the murderer."""

  name = "arbench_dc"
  subdir = "dc"

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    return [
        self._example(item, i, f"{self.path}: item {i}")
        for i, item in enumerate(guess_number.read_json(self.path))
    ]

  def _example(self, item: Any, i: int, where: str) -> base.Example:
    _need(item, ("initial_information", "suspects", "label"), where)
    info = item["initial_information"]
    _need(
        info,
        ("time", "location", "victim", "suspect"),
        where + " initial_information",
    )
    victim_fields = ("name", "introduction", "cause_of_death", "murder_weapon")
    _need(info["victim"], victim_fields, where + " victim")
    facts = {}
    for j, s in enumerate(item["suspects"]):
      _need(s, ("name", "story", "task"), f"{where} suspects[{j}]")
      facts[s["name"]] = _suspect_facts(s)
    shown = info["suspect"]
    for j, s in enumerate(shown):
      _need(
          s,
          ("name", "introduction"),
          f"{where} initial_information.suspect[{j}]",
      )
      if s["name"] not in facts:
        raise DataFileError(
            f"{where}: suspect {s['name']!r} has no hidden facts"
        )
    label = item["label"]
    if not (isinstance(label, int) and 0 <= label < len(shown) <= len(LETTERS)):
      raise DataFileError(f"{where}: label {label!r} is not a suspect index")
    v = info["victim"]
    lines = [
        "You are a detective. Find the murderer by questioning the suspects.",
        f"Time: {info['time']}. Location: {info['location']}.",
        (
            f"Victim: {v['name']}. {v['introduction']} Cause of death: "
            f"{v['cause_of_death']}. Murder weapon: {v['murder_weapon']}."
        ),
        "Suspects:",
        *(
            f"{LETTERS[j]}. {s['name']}: {s['introduction']}"
            for j, s in enumerate(shown)
        ),
        (
            "Each turn, ask one suspect one question: 'Question for <full"
            f" name>: <question>'. You have {self.max_turns} questions. Then"
            " reply 'Final answer: <letter"
            f" {LETTERS[0]}-{LETTERS[len(shown) - 1]}>'."
        ),
    ]
    return base.Example(
        uid=f"arbench-dc-{item.get('index', i)}",
        prompt="\n".join(lines),
        target={
            "letter": LETTERS[label],
            "suspects": [
                {"name": s["name"], "facts": facts[s["name"]]} for s in shown
            ],
        },
        meta={"key_question": item.get("key_question", [])},
    )

  def extract_answer(self, text: str) -> str | None:
    return extract_letter(text, len(LETTERS), lenient=True)

  def check(self, example: base.Example, answer: str) -> base.Verdict:
    ok = answer.strip().upper() == example.target["letter"]
    return base.Verdict(float(ok), ok, answer, "" if ok else "wrong suspect")

  def answer_key(self, answer: str) -> str:
    return answer.strip().upper()

  def make_environment(self, example: base.Example) -> DetectiveEnv:
    t = example.target
    return DetectiveEnv(
        t["suspects"], t["letter"], self.responder, self.max_turns
    )


@registry.register("arbench_sp")
class SituationPuzzlesTask(_ArBenchTask):
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
    for i, item in enumerate(guess_number.read_json(self.path)):
      where = f"{self.path}: item {i}"
      _need(item, ("surface", "bottom"), where)
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
              uid=f"arbench-sp-{item.get('index', i)}",
              prompt=prompt,
              target={"surface": item["surface"], "bottom": item["bottom"]},
              meta={"key_question": item.get("key_question", [])},
          )
      )
    return examples

  def extract_answer(self, text: str) -> str | None:
    m = re.search(r"final answer\s*:\s*(.+)", text, re.IGNORECASE | re.DOTALL)
    return m[1].strip() if m else None

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
