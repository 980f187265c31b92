"""AR-Bench question-asking tasks: the parts DC and SP share.

AR-Bench's Detective Cases (`arbench_dc.py`) and Situation Puzzles
(`arbench_sp.py`) are multi-turn: the team asks questions that a pluggable
`Responder` (sat_jax/tasks/responder.py) answers from hidden facts, within a
turn budget (AR-Bench: 25), then states a final answer. Both read
`<root>/data/<dc|sp>/test.json` (or the file itself) and keep one question
history per responder. Guessing numbers (GN) is in `guess_number.py`.
An example's uid is its position in the file ("arbench-sp-97"), and the
file's own `index` goes into `meta`: sp/test.json holds index 98 twice
(items 97 and 98), so that field does not name an item.
"""

import collections
import os
from typing import Any, Iterator

from sat_jax.tasks import base
from sat_jax.tasks import episodes
from sat_jax.tasks import files
from sat_jax.tasks import responder as responder_lib


class ResponderEnv(episodes.TurnBudgetEnv):
  """Questions answered by a responder; `history[who]` = [(q, a), ...]."""

  def __init__(self, responder: responder_lib.Responder, max_turns: int):
    self.responder = responder
    super().__init__(max_turns)

  def reset(self) -> str | None:
    self.history: dict[str, list[tuple[str, str]]] = collections.defaultdict(
        list
    )
    return super().reset()


class ArBenchTask(base.Task):
  """A test file, a responder (made on first use) and a turn budget."""

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
    self.path = files.find_file(path, rels)
    self.max_turns = max_turns
    self._responder_spec = responder
    self._responder = None

  @property
  def responder(self) -> responder_lib.Responder:
    if self._responder is None:
      self._responder = responder_lib.make_responder(self._responder_spec)
    return self._responder

  def _items(self) -> Iterator[tuple[int, Any, str]]:
    """(index, item, "<file>: item <index>") of every item of the file."""
    for i, item in enumerate(files.read_json_list(self.path)):
      yield i, item, f"{self.path}: item {i}"
