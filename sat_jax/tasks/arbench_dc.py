"""AR-Bench Detective Cases (`arbench_dc`): question suspects, name the killer.

The team sees the case (dc/test.json) and five suspects (A-E in
`initial_information` order) and questions them, one question per turn
written "Question for <name>: <question>". Each suspect answers through the
pluggable `Responder` from its hidden story and role. After `max_turns`
questions (AR-Bench: 25), or at any time, the team answers "Final answer:
<letter>" (AR-Bench's own "Answer: <letter>" is read once the questions run
out). Score: accuracy, the letter against `label` (AR-Bench's DC accuracy).
"""

import re
from typing import Any, Mapping, Sequence

from sat_jax.io_utils import DataFileError
from sat_jax.tasks import arbench
from sat_jax.tasks import base
from sat_jax.tasks import files
from sat_jax.tasks import registry
from sat_jax.tasks import responder as responder_lib

LETTERS = "ABCDEFGHIJ"
# Markdown emphasis around the label or the letter ("**Final answer:** D",
# "Final answer: **D**") is read through, as AR-Bench's last-letter rule does.
_FINAL_LETTER = r"final\s+answer[*_\s]*:[*_\s]*[\[(]?[*_]*([A-J])\b"
_ANY_LETTER = (  # AR-Bench's "Answer:"
    r"(?:final\s+)?answer[*_\s]*:[*_\s]*[\[(]?[*_]*([A-J])\b"
)


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


class DetectiveEnv(arbench.ResponderEnv):
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

  def _turn(self, message: str) -> str:
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


def _suspect_facts(s: Mapping[str, Any]) -> str:
  return (
      f"You are {s['name']}, a suspect questioned by a detective. Answer in "
      f"one sentence, in character, from your story.\nYour role: {s['task']}\n"
      f"Your story: {s['story']}"
  )


@registry.register("arbench_dc")
class DetectiveCasesTask(arbench.ArBenchTask):
  """AR-Bench DC: question five suspects, then name the murderer."""

  name = "arbench_dc"
  subdir = "dc"

  def load(self, split: str = "test") -> list[base.Example]:
    base.check_split(split, ("test",))
    return [self._example(item, i, where) for i, item, where in self._items()]

  def _example(self, item: Any, i: int, where: str) -> base.Example:
    files.require_fields(
        item, ("initial_information", "suspects", "label"), where
    )
    info = item["initial_information"]
    files.require_fields(
        info,
        ("time", "location", "victim", "suspect"),
        where + " initial_information",
    )
    victim_fields = ("name", "introduction", "cause_of_death", "murder_weapon")
    files.require_fields(info["victim"], victim_fields, where + " victim")
    facts = {}
    for j, s in enumerate(item["suspects"]):
      files.require_fields(
          s, ("name", "story", "task"), f"{where} suspects[{j}]"
      )
      facts[s["name"]] = _suspect_facts(s)
    shown = info["suspect"]
    for j, s in enumerate(shown):
      files.require_fields(
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
        uid=f"arbench-dc-{i}",
        prompt="\n".join(lines),
        target={
            "letter": LETTERS[label],
            "suspects": [
                {"name": s["name"], "facts": facts[s["name"]]} for s in shown
            ],
        },
        meta={
            "key_question": item.get("key_question", []),
            "index": item.get("index"),
        },
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
