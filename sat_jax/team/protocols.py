"""Team protocols (relay, vote, solo), routers, and the team answer rules.

Protocols (R = `rounds`; the router picks the active agents of each round):

  relay  In each round the active agents speak in turn (ascending index) on
         one shared transcript, each seeing everything before it, the
         earlier speakers of its own round included. Team answer: the answer
         in the last message.
  vote   In each round every active agent answers independently given the
         transcript of the earlier rounds (agents of one round do not see
         each other); the round's messages are then appended in agent order.
         Team answer: majority vote over the last round by `task.answer_key`
         of the extracted answers; messages without an answer do not vote;
         ties, and a round where nobody answers, go to the earliest agent.
  solo   Each active agent answers the prompt alone: it sees only the prompt,
         its own messages and (multi-turn tasks) the replies of its own copy
         of the environment. The pool is each agent's last message. Team
         answer: the majority vote of `vote` over the pool. Reward: the mean
         of the pooled answers' own rewards (with one active agent per
         episode, e.g. `round_robin` and R = 1, that is the public reference
         code's one-agent episode and its reward).

Routers (`active_agents`), for episode e (its index in the batch) and round r
of a team of n:
  all          every agent, every round.
  round_robin  one agent per round: agent (r + e) mod n, so episodes cycle
               through the agents from different starting points (with R = 1
               and solo this is the reference code's cycling of agents).
  random_k     k distinct agents per round, drawn with a generator seeded by
               (rollout seed, e, r): deterministic in the seed, per episode.
Inactive agents emit nothing and have no positions in that round.

Multi-turn tasks: after each round of relay / vote, the round's team message
(relay: the round's last message; vote: the round's voted message) is sent
to the environment, whose reply joins the transcript for every agent; solo
agents talk to their own environments after each of their messages. An
episode ends when its environment (all of them, in solo) is done, or after R
rounds.
"""

import dataclasses
from typing import Hashable, Sequence

from absl import logging
import numpy as np

from sat_jax import sampling
from sat_jax.tasks import base

PROTOCOLS = ("relay", "vote", "solo")
ROUTERS = ("all", "round_robin", "random_k")
OVERFLOW_POLICIES = ("error", "stop")
DEFAULT_VIEW_BUCKETS = tuple(2**i for i in range(6, 17))  # 64 .. 65536


def _check_buckets(name: str, buckets: tuple[int, ...]) -> None:
  if (
      not buckets
      or any(not isinstance(b, int) or b < 1 for b in buckets)
      or list(buckets) != sorted(set(buckets))
  ):
    raise ValueError(f"{name}={buckets} must be increasing positive ints")


@dataclasses.dataclass(frozen=True)
class ProtocolConfig:
  """How a team talks: protocol, router, rounds, message length, rendering.

  Attributes:
    protocol: one of PROTOCOLS (module docstring).
    router: one of ROUTERS.
    rounds: R >= 1.
    k: agents per round for `random_k` (1 <= k <= team size).
    max_new_tokens: the most tokens of one message.
    agent_tag: prefix of another agent's message in a viewer's rendering;
      formatted with number (1-based) and index (0-based).
    env_tag: prefix of an environment message ("" matches the tasks'
      demonstrations, which write environment replies as plain user turns).
    overflow: what happens when an agent's next prompt plus max_new_tokens
      exceeds its max_seq_len: "error" raises before sampling, naming the
      agent and the lengths; "stop" ends that episode there (no one speaks
      again; the team answer comes from what was said) and marks it
      `overflow` in its record.
    prompt_buckets: prompt lengths the sampler compiles for (each agent also
      gets its own max_seq_len - max_new_tokens as the last bucket).
    view_buckets: lengths T an agent's token stream [E, T] is padded to
      (the exact length when longer than all); a single bucket that fits
      every stream means the trainer's update compiles once.
    min_rows: a turn's sub-batch of one agent is padded to the next power of
      two of its row count, at least min_rows and at most the number of
      episodes (min_rows >= E: always E rows, one compile per prompt bucket).
  """

  protocol: str = "relay"
  router: str = "all"
  rounds: int = 1
  k: int = 1
  max_new_tokens: int = 64
  agent_tag: str = "[Agent {number}] "
  env_tag: str = ""
  overflow: str = "error"
  prompt_buckets: tuple[int, ...] = sampling.DEFAULT_BUCKETS
  view_buckets: tuple[int, ...] = DEFAULT_VIEW_BUCKETS
  min_rows: int = 1

  def __post_init__(self):
    for field, value, valid in (
        ("protocol", self.protocol, PROTOCOLS),
        ("router", self.router, ROUTERS),
        ("overflow", self.overflow, OVERFLOW_POLICIES),
    ):
      if value not in valid:
        raise ValueError(f"{field}={value!r} is not one of {valid}")
    for field in ("rounds", "k", "max_new_tokens", "min_rows"):
      value = getattr(self, field)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{field}={value!r} must be an int >= 1")
    object.__setattr__(self, "prompt_buckets", tuple(self.prompt_buckets))
    object.__setattr__(self, "view_buckets", tuple(self.view_buckets))
    _check_buckets("prompt_buckets", self.prompt_buckets)
    _check_buckets("view_buckets", self.view_buckets)
    try:
      self.agent_tag.format(number=1, index=0)
    except (KeyError, IndexError, ValueError) as e:
      raise ValueError(
          f"agent_tag={self.agent_tag!r} must format with {{number}} and"
          f" {{index}} only ({e})"
      ) from e

  def check_team(self, num_agents: int) -> None:
    """Raises ValueError if this protocol cannot run a team of that size."""
    if num_agents < 1:
      raise ValueError(f"a team needs at least one agent, got {num_agents}")
    if self.router == "random_k" and self.k > num_agents:
      raise ValueError(
          f"router random_k with k={self.k} exceeds the team of {num_agents}"
      )


def active_agents(
    cfg: ProtocolConfig,
    num_agents: int,
    episode: int,
    round_: int,
    seed: Sequence[int] = (0,),
) -> tuple[int, ...]:
  """The active agents of one round of one episode, ascending (docstring)."""
  if cfg.router == "all":
    return tuple(range(num_agents))
  if cfg.router == "round_robin":
    return ((round_ + episode) % num_agents,)
  rng = np.random.default_rng([*seed, episode, round_])
  return tuple(sorted(int(a) for a in rng.choice(num_agents, cfg.k, False)))


def vote_key(task: base.Task, text: str) -> Hashable | None:
  """The vote of one message: answer_key of its answer; None: no answer."""
  try:
    answer = task.extract_answer(text)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("%s: answer extraction raised %r", task.name, e)
    return None
  if answer is None:
    return None
  try:
    return task.answer_key(answer)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("%s: answer_key raised %r on %r", task.name, e, answer)
    return " ".join(answer.split())


def majority_index(task: base.Task, texts: Sequence[str]) -> int:
  """Index of the voted message (module docstring: vote); 0 if none votes."""
  if not texts:
    raise ValueError("majority over no messages")
  keys = [vote_key(task, t) for t in texts]
  voters = [i for i, key in enumerate(keys) if key is not None]
  if not voters:
    return 0
  return voters[base.majority([keys[i] for i in voters])]
