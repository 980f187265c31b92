"""The protocol loop: rounds, turns, environments and team answers of E episodes.

`play_episodes` runs every protocol of `protocols.py` on a batch of episodes
through a `Speaker`, which writes the messages. The loop is host Python over
turns, never over tokens: at each turn it gathers, per agent, every episode
in which that agent speaks, and asks the speaker for all of them at once
(`start` for every agent of the turn, then `finish`, so the LM speaker's
sampler calls for different agents are in flight together). The LM speaker
is `speaker.LMSpeaker`; tests use scripted speakers.

Keys: the turn of round r, slot s of agent k uses key number (r * S + s) * n
+ k of `jax.random.split(key, R * S * n)` (S: the most agents of a round),
so a rollout is a deterministic function of its key; the random_k router is
seeded by two words drawn from the key.
"""

import dataclasses
import functools
from typing import Any, Protocol, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import multihost
from sat_jax.tasks import base
from sat_jax.team import protocols
from sat_jax.team import transcript as transcript_lib

Message = transcript_lib.Message


@dataclasses.dataclass(frozen=True)
class Request:
  """Agent `agent` is to speak in episode `episode` having seen `messages`."""

  episode: int
  messages: tuple[Message, ...]
  round: int


class Speaker(Protocol):
  """Writes the messages of one agent for a batch of requests."""

  def start(self, agent: int, requests: Sequence[Request], key: jax.Array):
    """Begins writing (may return before the work is done)."""

  def finish(self, handle: Any) -> list[str | None]:
    """The message text per request; None: the episode overflowed."""


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
  """What happened in one episode, for rewards, logs and evaluation."""

  uid: str
  episode: int
  group: int
  messages: tuple[Message, ...]
  team_text: str  # the team answer message (protocol rule)
  team_speaker: int | None  # who wrote it (None: nobody spoke)
  verdict: base.Verdict  # of the team answer
  reward: float  # verdict.reward, or the pool mean for solo
  agent_texts: tuple[str, ...]  # each agent's last message ("" if silent)
  agent_verdicts: tuple[base.Verdict | None, ...]  # solo: each pooled one
  rounds: int  # rounds played
  overflow: bool = False
  multi_turn: bool = False
  own_tokens: tuple[int, ...] = ()  # per agent, filled by the LM rollout
  truncated: int = 0  # messages cut at max_new_tokens (LM rollout)


@dataclasses.dataclass
class _Episode:
  example: base.Example
  index: int
  group: int
  messages: list[Message]
  envs: list[base.Environment | None]  # one (relay, vote) or one per agent
  env_done: list[bool]
  env_errors: list[base.Verdict | None]
  overflow: bool = False
  rounds: int = 0

  @property
  def done(self) -> bool:
    if self.overflow:
      return True
    return any(e is not None for e in self.envs) and all(self.env_done)

  def visible(self, agent: int, protocol: str) -> tuple[Message, ...]:
    return visible_messages(self.messages, agent, protocol)


def visible_messages(
    messages: Sequence[Message], agent: int, protocol: str
) -> tuple[Message, ...]:
  """The messages `agent` sees, in the order of its own token stream.

  In `vote` an agent wrote its round-r message before seeing the others'
  (and the environment's reply), so in its view a round reads: its own
  message, the other agents' in agent order, then the environment.
  """
  seen = [m for m in messages if m.visible_to(agent)]
  if protocol != "vote":
    return tuple(seen)

  def rank(m: Message) -> tuple[int, int]:
    if m.speaker == transcript_lib.TASK:
      return (m.round, 0)
    if m.speaker == transcript_lib.ENV:
      return (m.round, 3)
    return (m.round, 1 if m.speaker == agent else 2)

  return tuple(sorted(seen, key=rank))


def turn_contexts(
    messages: Sequence[Message], agent: int, protocol: str
) -> list[tuple[tuple[Message, ...], Message]]:
  """(what `agent` had seen, what it said) for each of its messages.

  The first item is the `Request.messages` of that turn, recovered from an
  episode's transcript: in `relay` every earlier message it may see; in
  `vote` and `solo`, where a round's agents speak on the round-start view,
  every message of earlier rounds it may see.
  """
  out = []
  for t, m in enumerate(messages):
    if m.speaker != agent:
      continue
    if protocol == "relay":
      before = messages[:t]
    else:
      before = [x for x in messages if x.round < m.round]
    out.append((visible_messages(before, agent, protocol), m))
  return out


@functools.partial(jax.jit, static_argnums=1)
def _split(key: jax.Array, num: int) -> jax.Array:
  return jax.random.split(key, num)


@jax.jit
def _seed_words(key: jax.Array) -> jax.Array:
  return jax.random.bits(key, (2,), jnp.uint32)


def _new_episode(task, example, index, group, protocol, num_agents):
  copies = num_agents if protocol == "solo" else 1
  envs = [task.make_environment(example) for _ in range(copies)]
  if all(env is None for env in envs):
    envs = []
  messages = [Message(transcript_lib.TASK, example.prompt)]
  for j, env in enumerate(envs):
    opening = env.reset()
    if opening is not None:
      audience = j if protocol == "solo" else None
      messages.append(Message(transcript_lib.ENV, opening, -1, audience))
  return _Episode(
      example,
      index,
      group,
      messages,
      envs,
      [False] * len(envs),
      [None] * len(envs),
  )


def _env_step(task, ep: _Episode, j: int, text: str, round_: int, audience):
  """Sends a team message to environment j; its reply joins the transcript."""
  if not ep.envs or ep.env_done[j]:
    return
  try:
    reply = ep.envs[j].step(text)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning(
        "%s/%s: environment raised %r", task.name, ep.example.uid, e
    )
    ep.env_done[j] = True
    ep.env_errors[j] = base.Verdict(
        0.0, False, None, f"environment error: {type(e).__name__}: {e}"
    )
    return
  if reply.text is not None:
    ep.messages.append(
        Message(transcript_lib.ENV, reply.text, round_, audience)
    )
  ep.env_done[j] = ep.env_done[j] or reply.done


def _speak(speaker, requests_by_agent, keys, protocol, episodes, round_):
  """One turn: every agent's requests started, then finished; messages out."""
  handles = [
      (k, reqs, speaker.start(k, reqs, keys[k]))
      for k, reqs in requests_by_agent.items()
      if reqs
  ]
  said: list[tuple[int, int, str]] = []  # (episode, agent, text)
  for k, reqs, handle in handles:
    for req, text in zip(reqs, speaker.finish(handle)):
      if text is None:
        episodes[req.episode].overflow = True
      else:
        said.append((req.episode, k, text))
  audience = lambda k: k if protocol == "solo" else None
  return [
      (e, Message(k, text, round_, audience(k))) for e, k, text in sorted(said)
  ]


def _slots(cfg: protocols.ProtocolConfig, num_agents: int) -> int:
  """Turns per round: relay's speakers one after another, else one turn."""
  if cfg.protocol != "relay" or cfg.router == "round_robin":
    return 1
  return cfg.k if cfg.router == "random_k" else num_agents


def _requests(cfg, live, active, slot, num_agents):
  """agent -> the requests of turn `slot` (relay: its `slot`-th speaker)."""
  by_agent: dict[int, list[Request]] = {k: [] for k in range(num_agents)}
  for ep in live:
    if ep.done:
      continue
    if cfg.protocol == "relay":
      speakers = active[ep.index][slot : slot + 1]
    else:  # vote, solo: every active agent, on the round-start view
      speakers = [
          k
          for k in active[ep.index]
          if not (cfg.protocol == "solo" and ep.envs and ep.env_done[k])
      ]
    for k in speakers:
      by_agent[k].append(
          Request(ep.index, ep.visible(k, cfg.protocol), ep.rounds - 1)
      )
  return by_agent


def play_episodes(
    task: base.Task,
    examples: Sequence[base.Example],
    groups: Sequence[int],
    cfg: protocols.ProtocolConfig,
    num_agents: int,
    speaker: Speaker,
    key: jax.Array,
) -> list[EpisodeRecord]:
  """Plays one episode per example (episode e: examples[e], groups[e])."""
  cfg.check_team(num_agents)
  if len(groups) != len(examples):
    raise ValueError(f"{len(groups)} group ids for {len(examples)} examples")
  episodes = [
      _new_episode(task, ex, e, g, cfg.protocol, num_agents)
      for e, (ex, g) in enumerate(zip(examples, groups))
  ]
  slots = _slots(cfg, num_agents)
  key_router, key_turns = _split(key, 2)
  seed = [int(w) for w in multihost.to_host(_seed_words(key_router))]
  turn_keys = list(_split(key_turns, cfg.rounds * slots * num_agents))
  for r in range(cfg.rounds):
    live = [ep for ep in episodes if not ep.done]
    if not live:
      break
    active = {}
    for ep in live:
      ep.rounds = r + 1
      active[ep.index] = protocols.active_agents(
          cfg, num_agents, ep.index, r, seed
      )
    round_msgs: dict[int, list[Message]] = {ep.index: [] for ep in live}
    for s in range(slots):
      by_agent = _requests(cfg, live, active, s, num_agents)
      first = (r * slots + s) * num_agents
      keys = turn_keys[first : first + num_agents]
      for e, m in _speak(speaker, by_agent, keys, cfg.protocol, episodes, r):
        episodes[e].messages.append(m)
        round_msgs[e].append(m)
        if cfg.protocol == "solo":  # each agent's own environment
          _env_step(task, episodes[e], m.speaker, m.text, r, m.speaker)
    if cfg.protocol != "solo":
      for ep in live:
        msgs = round_msgs[ep.index]
        if msgs and ep.envs and not ep.overflow:
          _env_step(task, ep, 0, _round_action(cfg, task, msgs).text, r, None)
  return [_finish(task, cfg, ep, num_agents) for ep in episodes]


def _round_action(cfg, task, msgs: Sequence[Message]) -> Message:
  if cfg.protocol == "relay":
    return msgs[-1]
  return msgs[protocols.majority_index(task, [m.text for m in msgs])]


def _verdict(task, ep: _Episode, j: int, text: str) -> base.Verdict:
  if not ep.envs:
    return base.score_text(task, ep.example, text)
  if ep.env_errors[j] is not None:
    return ep.env_errors[j]
  return base.safe_verdict(task, ep.example, ep.envs[j])


def _solo_answer(task, ep: _Episode, last: dict[int, Message]):
  """(pick, verdict, reward, per-agent verdicts) of the solo pool."""
  pool = [last[j] for j in sorted(last)]
  verdicts = {m.speaker: _verdict(task, ep, m.speaker, m.text) for m in pool}
  if not pool:
    return None, base.Verdict(0.0, False, None, "no agent spoke"), 0.0, {}
  pick = pool[protocols.majority_index(task, [m.text for m in pool])]
  reward = float(np.mean([v.reward for v in verdicts.values()]))
  return pick, verdicts[pick.speaker], reward, verdicts


def _team_answer(task, cfg, ep: _Episode, agent_msgs: list[Message]):
  """(pick, verdict) of relay (last message) or vote (the last round's)."""
  if cfg.protocol == "relay":
    pick = agent_msgs[-1] if agent_msgs else None
  else:
    final_round = max((m.round for m in agent_msgs), default=None)
    final = [m for m in agent_msgs if m.round == final_round]
    pick = _round_action(cfg, task, final) if final else None
  if pick is None and not ep.envs:
    return None, base.Verdict(0.0, False, None, "no agent spoke")
  return pick, _verdict(task, ep, 0, pick.text if pick else "")


def _finish(task, cfg, ep: _Episode, num_agents: int) -> EpisodeRecord:
  agent_msgs = [m for m in ep.messages if m.speaker >= 0]
  last = {m.speaker: m for m in agent_msgs}
  if cfg.protocol == "solo":
    pick, verdict, reward, verdicts = _solo_answer(task, ep, last)
  else:
    (pick, verdict), verdicts = _team_answer(task, cfg, ep, agent_msgs), {}
    reward = float(verdict.reward)
  return EpisodeRecord(
      uid=ep.example.uid,
      episode=ep.index,
      group=ep.group,
      messages=tuple(ep.messages),
      team_text=pick.text if pick else "",
      team_speaker=pick.speaker if pick else None,
      verdict=verdict,
      reward=reward,
      agent_texts=tuple(
          last[j].text if j in last else "" for j in range(num_agents)
      ),
      agent_verdicts=tuple(verdicts.get(j) for j in range(num_agents)),
      rounds=ep.rounds,
      overflow=ep.overflow,
      multi_turn=bool(ep.envs),
  )
