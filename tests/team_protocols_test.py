"""Protocols, routers and team answers on scripted agents (no models)."""

import re

import jax
import pytest

from sat_jax.tasks import base
from sat_jax.team import play
from sat_jax.team import protocols
from sat_jax.team import transcript

TASK, ENV = transcript.TASK, transcript.ENV


class CountTask(base.Task):
  """Answer: the last integer; correct iff it equals the target."""

  name = "count"

  def __init__(self, env_turns: int = 0):
    self.env_turns = env_turns

  def load(self, split):
    return [base.Example(f"p{i}", f"prompt {i}", "7") for i in range(3)]

  def extract_answer(self, text):
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None

  def check(self, example, answer):
    ok = answer == example.target
    return base.Verdict(float(ok), ok, answer)

  def make_environment(self, example):
    return EchoEnv(self.env_turns) if self.env_turns else None


class EchoEnv(base.Environment):
  """Replies 'echo <message>'; done after `turns` messages; solved by '7'."""

  def __init__(self, turns):
    self.turns = turns
    self.reset()

  def reset(self):
    self.seen = []
    return "start"

  def step(self, message):
    self.seen.append(message)
    return base.EnvReply(f"echo {message}", len(self.seen) >= self.turns)

  def verdict(self):
    ok = bool(self.seen) and self.seen[-1].endswith("7")
    return base.Verdict(float(ok), ok, self.seen[-1] if self.seen else None)


def _name(m: transcript.Message) -> str:
  if m.speaker == TASK:
    return "T"
  if m.speaker == ENV:
    return "E"
  return f"A{m.speaker}r{m.round}"


class ScriptedSpeaker:
  """Message = 'A<k>r<r>' + what it saw; answers from `answers[(e, k, r)]`."""

  def __init__(self, answers=None):
    self.answers = answers or {}
    self.seen = {}  # (episode, agent, round) -> tuple of message names

  def start(self, agent, requests, key):
    del key
    out = []
    for q in requests:
      names = tuple(_name(m) for m in q.messages)
      self.seen[(q.episode, agent, q.round)] = names
      answer = self.answers.get((q.episode, agent, q.round), "")
      out.append(f"A{agent}r{q.round} saw {','.join(names)} {answer}".strip())
    return out

  def finish(self, handle):
    return handle


def _play(
    protocol,
    router="all",
    rounds=1,
    n=3,
    answers=None,
    env_turns=0,
    k=1,
    episodes=1,
    key=0,
):
  task = CountTask(env_turns)
  cfg = protocols.ProtocolConfig(
      protocol=protocol, router=router, rounds=rounds, k=k
  )
  speaker = ScriptedSpeaker(answers)
  examples = task.load("train")[:1] * episodes
  records = play.play_episodes(
      task, examples, [0] * episodes, cfg, n, speaker, jax.random.key(key)
  )
  return records, speaker


# --------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(protocol="debate"), "protocol='debate' is not one of"),
        (dict(router="judge"), "'all', 'round_robin', 'random_k'"),
        (dict(rounds=0), "rounds=0 must be an int >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens=0"),
        (dict(overflow="truncate"), "overflow="),
        (dict(agent_tag="[{name}]"), "agent_tag="),
        (dict(view_buckets=(128, 64)), "view_buckets="),
    ],
)
def test_bad_protocol_config_names_the_field(kwargs, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    protocols.ProtocolConfig(**kwargs)


def test_unknown_protocol_lists_the_valid_ones():
  with pytest.raises(ValueError, match="relay.*vote.*solo"):
    protocols.ProtocolConfig(protocol="chain")


def test_random_k_larger_than_the_team_is_refused():
  cfg = protocols.ProtocolConfig(router="random_k", k=3)
  with pytest.raises(ValueError, match="k=3 exceeds the team of 2"):
    cfg.check_team(2)


# --------------------------------------------------------------- routers


def test_routers_all_and_round_robin():
  all_cfg = protocols.ProtocolConfig()
  assert protocols.active_agents(all_cfg, 3, 5, 2) == (0, 1, 2)
  rr = protocols.ProtocolConfig(router="round_robin")
  table = [
      [protocols.active_agents(rr, 3, e, r)[0] for r in range(4)]
      for e in range(3)
  ]
  assert table == [[0, 1, 2, 0], [1, 2, 0, 1], [2, 0, 1, 2]]


def test_random_k_sets_are_deterministic_in_the_seed():
  cfg = protocols.ProtocolConfig(router="random_k", k=2)
  sets = lambda seed: [
      protocols.active_agents(cfg, 4, e, r, seed)
      for e in range(8)
      for r in range(3)
  ]
  a, b, c = sets((1, 2)), sets((1, 2)), sets((1, 3))
  assert a == b and a != c
  assert all(len(s) == 2 and s[0] < s[1] and s[1] < 4 for s in a)
  assert len(set(a)) > 1  # not the same pair everywhere


def test_majority_ties_go_to_the_earliest_and_silence_does_not_vote():
  task = CountTask()
  assert protocols.majority_index(task, ["5", "7", "7"]) == 1
  assert protocols.majority_index(task, ["x", "5", "7"]) == 1  # tie: earliest
  assert protocols.majority_index(task, ["x", "y", "3"]) == 2
  assert protocols.majority_index(task, ["x", "y"]) == 0  # nobody votes


# --------------------------------------------------------------- semantics


def test_relay_each_agent_sees_everything_before_it():
  records, speaker = _play("relay", rounds=2, answers={(0, 2, 1): "7"})
  seen = speaker.seen
  assert seen[(0, 0, 0)] == ("T",)
  assert seen[(0, 2, 0)] == ("T", "A0r0", "A1r0")  # agents 1-2 of its round
  assert seen[(0, 0, 1)] == ("T", "A0r0", "A1r0", "A2r0")
  assert seen[(0, 2, 1)] == ("T", "A0r0", "A1r0", "A2r0", "A0r1", "A1r1")
  (rec,) = records
  assert [_name(m) for m in rec.messages][-1] == "A2r1"
  assert rec.team_speaker == 2 and rec.team_text.endswith("7")
  assert rec.verdict.correct and rec.reward == 1.0
  assert rec.agent_texts[0].startswith("A0r1")


def test_vote_agents_of_one_round_do_not_see_each_other():
  answers = {(0, 0, 1): "5", (0, 1, 1): "7", (0, 2, 1): "7"}
  records, speaker = _play("vote", rounds=2, answers=answers)
  seen = speaker.seen
  for k in range(3):
    assert seen[(0, k, 0)] == ("T",)
  # Own message first, then the others of that round, in agent order.
  assert seen[(0, 1, 1)] == ("T", "A1r0", "A0r0", "A2r0")
  assert seen[(0, 2, 1)] == ("T", "A2r0", "A0r0", "A1r0")
  (rec,) = records
  assert rec.team_speaker == 1 and rec.verdict.correct  # 7 beats 5, 2:1


def test_vote_tie_goes_to_the_earliest_agent():
  answers = {(0, 0, 0): "5", (0, 1, 0): "7", (0, 2, 0): "none"}
  (rec,), _ = _play("vote", answers=answers)
  assert rec.team_speaker == 0 and not rec.verdict.correct


def test_solo_agents_answer_alone_and_the_pool_is_voted_and_averaged():
  answers = {(0, 0, 1): "7", (0, 1, 1): "5", (0, 2, 1): "7"}
  (rec,), speaker = _play("solo", rounds=2, answers=answers)
  assert speaker.seen[(0, 1, 0)] == ("T",)
  assert speaker.seen[(0, 1, 1)] == ("T", "A1r0")  # only its own message
  assert rec.team_speaker == 0 and rec.verdict.correct
  assert rec.reward == pytest.approx(2 / 3)  # mean of the pooled verdicts
  assert [v.correct for v in rec.agent_verdicts] == [True, False, True]


def test_round_robin_relay_order_and_inactive_agents_silent():
  records, _ = _play("relay", router="round_robin", rounds=2, episodes=3)
  speakers = [
      [m.speaker for m in r.messages if m.speaker >= 0] for r in records
  ]
  assert speakers == [[0, 1], [1, 2], [2, 0]]
  assert records[0].agent_texts[2] == ""  # agent 2 never spoke in episode 0


def test_random_k_only_the_drawn_agents_speak():
  records, _ = _play(
      "relay", router="random_k", k=2, n=4, rounds=3, episodes=4, key=3
  )
  cfg = protocols.ProtocolConfig(router="random_k", k=2)
  seed = [
      int(w)
      for w in jax.device_get(
          play._seed_words(play._split(jax.random.key(3), 2)[0])
      )
  ]
  for rec in records:
    for r in range(3):
      spoke = [
          m.speaker for m in rec.messages if m.speaker >= 0 and m.round == r
      ]
      assert tuple(spoke) == protocols.active_agents(
          cfg, 4, rec.episode, r, seed
      )


def test_environment_replies_reach_every_agent_after_each_round():
  answers = {(0, 1, 1): "7"}
  (rec,), speaker = _play("relay", n=2, rounds=3, env_turns=2, answers=answers)
  names = [_name(m) for m in rec.messages]
  assert names == ["T", "E", "A0r0", "A1r0", "E", "A0r1", "A1r1", "E"]
  # The round's last message goes to the environment; it stops at 2 turns.
  assert rec.messages[4].text == "echo " + rec.messages[3].text
  assert speaker.seen[(0, 0, 1)] == ("T", "E", "A0r0", "A1r0", "E")
  assert rec.rounds == 2 and rec.multi_turn and rec.verdict.correct


def test_solo_agents_have_their_own_environment():
  (rec,), speaker = _play("solo", n=2, rounds=2, env_turns=1)
  assert speaker.seen[(0, 1, 0)] == ("T", "E")  # its own opening only
  audiences = [(m.speaker, m.audience) for m in rec.messages]
  assert audiences == [
      (TASK, None),
      (ENV, 0),
      (ENV, 1),
      (0, 0),
      (ENV, 0),
      (1, 1),
      (ENV, 1),
  ]
  assert rec.rounds == 1  # both environments were done after one turn


@pytest.mark.parametrize(
    "protocol, router, env_turns",
    [
        ("relay", "all", 0),
        ("relay", "all", 3),
        ("relay", "round_robin", 3),
        ("vote", "all", 3),
        ("solo", "all", 3),
    ],
)
def test_turn_contexts_recover_what_each_agent_was_shown(
    protocol, router, env_turns
):
  records, speaker = _play(
      protocol, router=router, rounds=3, n=3, env_turns=env_turns, episodes=2
  )
  turns = 0
  for rec in records:
    for agent in range(3):
      for seen, said in play.turn_contexts(rec.messages, agent, protocol):
        key = (rec.episode, agent, said.round)
        assert tuple(_name(m) for m in seen) == speaker.seen[key]
        assert said.speaker == agent and said.text.startswith(
            f"A{agent}r{said.round}"
        )
        turns += 1
  # Every request of the speaker was recovered, none invented.
  assert turns == len(speaker.seen)
