"""Batched LM team rollouts as the SAT core's `RolloutFn`.

    rollout_fn = make_rollout_fn(agents, tokenizers, task, examples, protocol,
                                 num_prompts=8, group_size=4)
    batch = rollout_fn(team_params, key)      # a core TeamBatch
    rollout_fn.last.stats, rollout_fn.last.episodes

A rollout draws `num_prompts` examples without replacement (a permutation of
the source by the key), plays `group_size` episodes of each (E = num_prompts
x group_size; group g = episodes g*G .. g*G + G - 1) with `play_episodes`
and the LM speaker, and returns one `AgentView` per agent:

  inputs = {"tokens_ExT", "mask_ExT"}   the agent's token stream per episode,
                                        right-padded to a view bucket T_k
  mask_ExT            the agent's own sampled tokens (False where inactive)
  behaviour_logp_ExT  their log-probs under the sampling distribution

with reward_E from the task verifier (protocol rules in protocols.py) and
group_E. A rollout is a deterministic function of (params, key). Under a
mesh every array is placed with its rows over the logical "batch" axis.
"""

import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from sat_jax import models
from sat_jax import multihost
from sat_jax import scoring
from sat_jax import sharding
from sat_jax.core import batch as batch_lib
from sat_jax.tasks import base
from sat_jax.team import lm_agent as lm_agent_lib
from sat_jax.team import play
from sat_jax.team import protocols
from sat_jax.team import speaker as speaker_lib
from sat_jax.team import transcript as transcript_lib

PyTree = Any


@dataclasses.dataclass(frozen=True)
class RolloutResult:
  """One rollout: the team batch, every episode's record, summary stats."""

  batch: batch_lib.TeamBatch | None
  episodes: tuple[play.EpisodeRecord, ...]
  stats: dict[str, float]


def view_length(length: int, cfg: protocols.ProtocolConfig) -> int:
  """T of a view whose longest stream has `length` tokens: its bucket."""
  return next((b for b in cfg.view_buckets if b >= length), length)


def build_views(
    speaker: speaker_lib.LMSpeaker, cfg: protocols.ProtocolConfig
) -> tuple[batch_lib.AgentView, ...]:
  """One AgentView per agent from the speaker's streams (host arrays put)."""
  views = []
  for k in range(len(speaker.agents)):
    streams = [eps[k] for eps in speaker.streams]
    e = len(streams)
    t = view_length(max(max(s.length for s in streams), 1), cfg)
    tokens = np.full((e, t), speaker.renderers[k].pad_id, np.int32)
    valid = np.zeros((e, t), np.int32)
    own = np.zeros((e, t), bool)
    logp = np.zeros((e, t), np.float32)
    for i, s in enumerate(streams):
      ids, own_i, logp_i = s.arrays()
      n = len(ids)
      tokens[i, :n], valid[i, :n], own[i, :n], logp[i, :n] = (
          ids,
          1,
          own_i,
          logp_i,
      )
    # The agent's own tokens, so that scoring runs its output head there
    # only (most of a relay view is other agents' and the task's text).
    # An agent speaks at most once a round: A stays fixed across batches.
    positions = scoring.action_positions(
        own, capacity=cfg.rounds * cfg.max_new_tokens
    )
    where = speaker_lib.batch_sharding((e, t))
    tokens, valid, own, logp = jax.device_put((tokens, valid, own, logp), where)
    inputs = {"tokens_ExT": tokens, "mask_ExT": valid}
    if positions is not None:
      inputs["positions_ExA"] = jax.device_put(
          positions, speaker_lib.batch_sharding(positions.shape)
      )
    views.append(
        batch_lib.AgentView(
            inputs=inputs,
            mask_ExT=own,
            behaviour_logp_ExT=logp,
        )
    )
  return tuple(views)


def _stats(records, speaker, seconds) -> dict[str, float]:
  n = len(speaker.agents)
  rewards = [r.reward for r in records]
  stats = {
      "reward_mean": float(np.mean(rewards)),
      "accuracy": float(np.mean([r.verdict.correct for r in records])),
      "no_answer_rate": float(
          np.mean([r.verdict.answer is None for r in records])
      ),
      "episodes": float(len(records)),
      "overflow_rate": float(np.mean([r.overflow for r in records])),
      "truncated_messages": float(sum(r.truncated for r in records)),
      "sampler_calls": float(speaker.calls),
      "rounds_mean": float(np.mean([r.rounds for r in records])),
      "rollout_s": seconds,
      **speaker.timing,
  }
  for k in range(n):
    own = [eps[k].own_tokens for eps in speaker.streams]
    lengths = [eps[k].length for eps in speaker.streams]
    stats[f"agent{k}/own_tokens_mean"] = float(np.mean(own))
    stats[f"agent{k}/view_tokens_max"] = float(max(lengths))
    stats[f"agent{k}/active_rate"] = float(np.mean([o > 0 for o in own]))
  return stats


def run_rollout(
    speaker: speaker_lib.LMSpeaker,
    params: Sequence[PyTree],
    task: base.Task,
    examples: Sequence[base.Example],
    groups: Sequence[int],
    cfg: protocols.ProtocolConfig,
    key: jax.Array,
    *,
    with_batch: bool = True,
) -> RolloutResult:
  """Plays one episode per example and, with `with_batch`, builds the batch."""
  t0 = time.perf_counter()
  speaker.reset(params, len(examples))
  records = play.play_episodes(
      task, examples, groups, cfg, len(speaker.agents), speaker, key
  )
  records = tuple(
      dataclasses.replace(
          r,
          own_tokens=tuple(s.own_tokens for s in speaker.streams[r.episode]),
          truncated=sum(s.cut_messages for s in speaker.streams[r.episode]),
      )
      for r in records
  )
  batch = None
  if with_batch:
    num_groups = int(max(groups)) + 1
    where = speaker_lib.batch_sharding((len(records),))
    reward, group = jax.device_put(
        (
            np.asarray([r.reward for r in records], np.float32),
            np.asarray(groups, np.int32),
        ),
        where,
    )
    batch = batch_lib.TeamBatch(
        views=build_views(speaker, cfg),
        reward_E=reward,
        group_E=group,
        num_groups=num_groups,
    )
  return RolloutResult(
      batch, records, _stats(records, speaker, time.perf_counter() - t0)
  )


def check_agents(
    agents: Sequence[lm_agent_lib.LMAgent], tokenizers: Sequence[Any]
) -> None:
  """Each agent an LMAgent whose tokenizer can drive its model."""
  if len(agents) != len(tokenizers):
    raise ValueError(f"{len(agents)} agents but {len(tokenizers)} tokenizers")
  if not agents:
    raise ValueError("a team needs at least one agent")
  for k, (agent, tok) in enumerate(zip(agents, tokenizers)):
    if not isinstance(agent, lm_agent_lib.LMAgent):
      raise TypeError(f"agent {k} is a {type(agent).__name__}, not an LMAgent")
    try:
      models.check_fits(tok, agent.config)
    except models.TokenizerError as e:
      raise models.TokenizerError(f"agent {k}: {e}") from e


def check_first_prompts(
    agents, renderers, examples, cfg: protocols.ProtocolConfig
) -> None:
  """Raises if some example's first prompt cannot fit an agent's context."""
  first = [
      (transcript_lib.Message(transcript_lib.TASK, ex.prompt),)
      for ex in examples
  ]
  for k, (agent, r) in enumerate(zip(agents, renderers)):
    rendered = r.render([r.chat(m, k) for m in first], f"agent {k}")
    lengths = [len(ids) for ids in r.encode(rendered)]
    worst = int(np.argmax(lengths))
    need = lengths[worst] + cfg.max_new_tokens
    if need > agent.config.max_seq_len:
      raise speaker_lib.ContextOverflowError(
          f"agent {k}: example {examples[worst].uid!r} renders to a prompt of"
          f" {lengths[worst]} tokens; + max_new_tokens {cfg.max_new_tokens}"
          f" = {need} > max_seq_len {agent.config.max_seq_len}"
      )
    r.clear_cache()


class LMRollout:
  """The core's RolloutFn over LM agents; keeps the last rollout's records.

  `last` is the latest RolloutResult; `pop_results()` returns (and forgets)
  every result since the previous pop, e.g. the stage-start rollout and, in
  `resample` mode, the later ones.
  """

  def __init__(
      self,
      agents: Sequence[lm_agent_lib.LMAgent],
      tokenizers: Sequence[Any],
      task: base.Task,
      examples: Sequence[base.Example],
      cfg: protocols.ProtocolConfig,
      *,
      num_prompts: int,
      group_size: int,
      chat_templates: Sequence[str | None] | None = None,
      share_renderings: bool = True,
      sampling_mesh: jax.sharding.Mesh | None = None,
      sampling_rules: sharding.LogicalRules | None = None,
  ):
    check_agents(agents, tokenizers)
    cfg.check_team(len(agents))
    if not isinstance(group_size, int) or group_size < 2:
      raise ValueError(
          f"group_size={group_size!r} must be an int >= 2 (the advantage is"
          " group-relative)"
      )
    if not isinstance(num_prompts, int) or num_prompts < 1:
      raise ValueError(f"num_prompts={num_prompts!r} must be an int >= 1")
    if num_prompts > len(examples):
      raise ValueError(
          f"num_prompts={num_prompts} exceeds the {len(examples)} examples of"
          f" task {task.name!r}"
      )
    renderers = transcript_lib.make_renderers(
        tokenizers,
        chat_templates,
        system_prompt=task.system_prompt,
        agent_tag=cfg.agent_tag,
        env_tag=cfg.env_tag,
        share=share_renderings,
    )
    check_first_prompts(agents, renderers, examples, cfg)
    options = [
        speaker_lib.training_options(a, r, cfg)
        for a, r in zip(agents, renderers)
    ]
    self.speaker = speaker_lib.LMSpeaker(
        agents,
        renderers,
        options,
        cfg,
        training=True,
        sampling_mesh=sampling_mesh,
        sampling_rules=sampling_rules,
    )
    self.task, self.examples, self.cfg = task, list(examples), cfg
    self.num_prompts, self.group_size = num_prompts, group_size
    self.last: RolloutResult | None = None
    self._results: list[RolloutResult] = []

  @property
  def num_episodes(self) -> int:
    return self.num_prompts * self.group_size

  def choose(self, key: jax.Array) -> list[int]:
    """Indices of this key's prompts (a prefix of a permutation)."""
    perm = multihost.to_host(_permutation(key, len(self.examples)))
    return [int(i) for i in perm[: self.num_prompts]]

  def __call__(
      self, params: Sequence[PyTree], key: jax.Array
  ) -> batch_lib.TeamBatch:
    key_prompts, key_play = _split2(key)
    chosen = self.choose(key_prompts)
    examples = [
        self.examples[i] for i in chosen for _ in range(self.group_size)
    ]
    groups = [
        g for g in range(self.num_prompts) for _ in range(self.group_size)
    ]
    result = run_rollout(
        self.speaker, params, self.task, examples, groups, self.cfg, key_play
    )
    self.last = result
    self._results.append(result)
    return result.batch

  def pop_results(self) -> list[RolloutResult]:
    out, self._results = self._results, []
    return out


@jax.jit
def _split2(key):
  return tuple(jax.random.split(key, 2))


_permutation = jax.jit(jax.random.permutation, static_argnums=1)


def make_rollout_fn(
    agents: Sequence[lm_agent_lib.LMAgent],
    tokenizers: Sequence[Any],
    task: base.Task,
    examples: Sequence[base.Example],
    protocol: protocols.ProtocolConfig,
    *,
    num_prompts: int,
    group_size: int,
    chat_templates: Sequence[str | None] | None = None,
    share_renderings: bool = True,
    sampling_mesh: jax.sharding.Mesh | None = None,
    sampling_rules: sharding.LogicalRules | None = None,
) -> LMRollout:
  """The core's `RolloutFn` (params tuple, key) -> TeamBatch; see LMRollout.

  Validates everything before any sampling: agent types, tokenizer fit,
  chat templates, the protocol for this team size, group_size >= 2, and
  that every example's first prompt fits every agent's context.
  `share_renderings` lets agents with the same tokenizer and template share
  renderings and tokenisations (identical batches, less host work).
  `sampling_mesh` / `sampling_rules`: where the sampler runs, if not on the
  caller's mesh (speaker.py); the batch is placed on the caller's mesh.
  """
  return LMRollout(
      agents,
      tokenizers,
      task,
      examples,
      protocol,
      num_prompts=num_prompts,
      group_size=group_size,
      chat_templates=chat_templates,
      share_renderings=share_renderings,
      sampling_mesh=sampling_mesh,
      sampling_rules=sampling_rules,
  )
