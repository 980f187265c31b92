"""Team generation for evaluation: the `generate_fn` of `sat_jax.eval.runner`.

    generate_fn = make_generate_fn(agents, tokenizers, task, protocol, params)
    summary = runner.evaluate(task, examples, generate_fn, k, key, out_dir)

`generate_fn(examples, k, key)` plays k independent team episodes of every
example in one batch (E = len(examples) x k episodes; episode j of example
i is number i * k + j, which the routers see) and returns, per example, k
`TeamSample`s: the team answer message (protocol rule), each agent's last
message ("" for an agent that never spoke), the transcript as JSON rows, and
for multi-turn tasks the environment's verdict (single-turn samples are
scored by the runner from the text).

Sampling: by default each agent's training distribution (its temperature,
no top-k / top-p); `temperature`, `top_p`, `top_k` override it for every
agent (temperature 0: greedy, so the k samples coincide).
"""

import dataclasses
from typing import Any, Sequence

import jax

from sat_jax import sharding
from sat_jax.eval import runner
from sat_jax.tasks import base
from sat_jax.team import lm_agent as lm_agent_lib
from sat_jax.team import protocols
from sat_jax.team import rollout as rollout_lib
from sat_jax.team import speaker as speaker_lib
from sat_jax.team import transcript as transcript_lib

PyTree = Any


def _sample(record) -> runner.TeamSample:
  return runner.TeamSample(
      text=record.team_text,
      agent_texts=record.agent_texts,
      transcript=[m.to_json() for m in record.messages],
      verdict=record.verdict if record.multi_turn else None,
  )


def make_generate_fn(
    agents: Sequence[lm_agent_lib.LMAgent],
    tokenizers: Sequence[Any],
    task: base.Task,
    protocol: protocols.ProtocolConfig,
    params: Sequence[PyTree],
    *,
    chat_templates: Sequence[str | None] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    share_renderings: bool = True,
    sampling_mesh: jax.sharding.Mesh | None = None,
    sampling_rules: sharding.LogicalRules | None = None,
) -> runner.GenerateFn:
  """`generate_fn(examples, k, key)` for `runner.evaluate` (module docstring).

  `params` holds one parameter pytree per agent (e.g. `core.team_params`).
  The last call's `RolloutResult` (records and stats, no batch) is kept as
  `generate_fn.last`; `generate_fn.speaker` is the LM speaker.
  `sampling_mesh` / `sampling_rules`: where the sampler runs (speaker.py).
  """
  rollout_lib.check_agents(agents, tokenizers)
  protocol.check_team(len(agents))
  if len(params) != len(agents):
    raise ValueError(f"{len(params)} parameter sets for {len(agents)} agents")
  renderers = transcript_lib.make_renderers(
      tokenizers,
      chat_templates,
      system_prompt=task.system_prompt,
      agent_tag=protocol.agent_tag,
      env_tag=protocol.env_tag,
      share=share_renderings,
  )
  overrides = {
      name: value
      for name, value in (
          ("temperature", temperature),
          ("top_p", top_p),
          ("top_k", top_k),
      )
      if value is not None
  }
  options = [
      dataclasses.replace(
          speaker_lib.training_options(a, r, protocol), **overrides
      )
      for a, r in zip(agents, renderers)
  ]
  speaker = speaker_lib.LMSpeaker(
      agents,
      renderers,
      options,
      protocol,
      training=False,
      sampling_mesh=sampling_mesh,
      sampling_rules=sampling_rules,
  )
  params = tuple(params)

  def generate_fn(
      examples: Sequence[base.Example], k: int, key: jax.Array
  ) -> list[list[runner.TeamSample]]:
    if not isinstance(k, int) or k < 1:
      raise ValueError(f"k must be an int >= 1, got {k!r}")
    rollout_lib.check_first_prompts(agents, renderers, examples, protocol)
    episodes = [ex for ex in examples for _ in range(k)]
    groups = [i for i in range(len(examples)) for _ in range(k)]
    result = rollout_lib.run_rollout(
        speaker,
        params,
        task,
        episodes,
        groups,
        protocol,
        key,
        with_batch=False,
    )
    generate_fn.last = result
    records = result.episodes
    return [
        [_sample(r) for r in records[i * k : (i + 1) * k]]
        for i in range(len(examples))
    ]

  generate_fn.last = None
  generate_fn.speaker = speaker
  return generate_fn
