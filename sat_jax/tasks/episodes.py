"""Multi-turn episodes: a budget of team turns, one final answer, demos.

`TurnBudgetEnv` is the episode shape shared by guess-the-number, twenty
questions and AR-Bench DC / SP: each team message is one turn (a guess, a
question) unless it states a final answer, which ends the episode at once.
The reply to the `max_turns`-th turn asks for the final answer, and the next
message ends the episode whatever it says. `scripted_episode` plays a
scripted policy through an environment and returns the chat, which is what
`Task.demonstration_messages` gives for multi-turn tasks.
"""

import abc
from typing import Any, Callable

from sat_jax.tasks import base


class TurnBudgetEnv(base.Environment):
  """Up to `max_turns` team turns, then one final answer.

  Subclasses implement `_final` (the final answer in a message, if any; it
  may read the message more leniently once `awaiting_final` is set), `_turn`
  (the reply to a message that is not a final answer; it may set `done` when
  the turn itself ends the episode) and `verdict`. State after `reset`:
  `turns`, `done`, `awaiting_final` and `answer` (the final answer, or what
  a subclass records as the current answer).
  """

  kind = "episode"  # the task name, in errors
  turn_noun = "questions"  # what runs out: "No <turn_noun> left."
  final_hint = "Final answer: ..."  # the form asked for after the last turn

  def __init__(self, max_turns: int):
    if max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    self.max_turns = max_turns
    self.reset()

  def reset(self) -> str | None:
    self.turns = 0
    self.done = self.awaiting_final = False
    self.answer: str | None = None
    return None

  @abc.abstractmethod
  def _final(self, message: str) -> str | None:
    """The final answer stated in `message`, if any."""

  @abc.abstractmethod
  def _turn(self, message: str) -> str:
    """Answers one team message that is not a final answer."""

  def _closing(self) -> str | None:
    """The reply to the final answer (None: say nothing)."""
    return None

  def step(self, message: str) -> base.EnvReply:
    if self.done:
      raise RuntimeError(f"{self.kind}: step() after the episode ended")
    final = self._final(message)
    if final is not None or self.awaiting_final:
      self.answer, self.done = final, True
      return base.EnvReply(self._closing(), True)
    text = self._turn(message)
    if self.done:
      return base.EnvReply(text, True)
    self.turns += 1
    if self.turns >= self.max_turns:
      self.awaiting_final = True
      text += f" No {self.turn_noun} left. Reply with: {self.final_hint}"
    return base.EnvReply(text, False)


def scripted_episode(
    prompt: str, env: base.Environment, policy: Callable[[], str]
) -> list[dict[str, Any]]:
  """The chat of one episode in which `policy()` writes every team message.

  [user: prompt, (user: the environment's opening)?, assistant: move,
  user: reply, ...]; a reply of None adds no message. The policy may read
  the environment's state; it is called until the episode is done.
  """
  messages = [base.message("user", prompt)]
  opening = env.reset()
  if opening is not None:
    messages.append(base.message("user", opening))
  done = False
  while not done:
    move = policy()
    reply = env.step(move)
    done = reply.done
    messages.append(base.message("assistant", move))
    if reply.text is not None:
      messages.append(base.message("user", reply.text))
  return messages
