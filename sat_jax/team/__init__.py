"""LM teams: agents on the SAT core, protocols, batched rollouts, generation.

Public API (what the trainer and `sat-jax eval` use):

  LMAgent(config: ModelConfig, temperature: float = 1.0,
          chunk_size: int = 128, remat: bool = False)
      The core's Agent for one LM; inputs {"tokens_ExT", "mask_ExT"} are the
      agent's own rendering of each episode (lm_agent.py).

  ProtocolConfig(protocol="relay", router="all", rounds=1, k=1,
                 max_new_tokens=64, agent_tag="[Agent {number}] ",
                 env_tag="", overflow="error", prompt_buckets=...,
                 view_buckets=..., min_rows=1)
      protocol in PROTOCOLS = ("relay", "vote", "solo"), router in ROUTERS =
      ("all", "round_robin", "random_k") (protocols.py). A single
      `view_buckets` entry that holds every stream keeps the views' T fixed,
      so the core's update compiles once per agent architecture.

  make_rollout_fn(agents, tokenizers, task, examples, protocol, *,
                  num_prompts: int, group_size: int,
                  chat_templates=None, share_renderings=True) -> LMRollout
      LMRollout(params: tuple[PyTree, ...], key) -> core TeamBatch; its
      `.last` is a RolloutResult(batch, episodes, stats) and
      `.pop_results()` returns every result since the last pop (rollout.py).

  make_generate_fn(agents, tokenizers, task, protocol, params, *,
                   chat_templates=None, temperature=None, top_p=None,
                   top_k=None, share_renderings=True) -> generate_fn
      generate_fn(examples, k, key) -> per example k eval TeamSamples, for
      `sat_jax.eval.runner.evaluate` (generate.py).

Modules: `transcript` (messages, per-agent rendering, token streams),
`play` (the protocol loop over a Speaker), `speaker` (the LM speaker: batched
sampling per agent and turn), `rollout`, `generate`.
"""

from sat_jax.team.generate import make_generate_fn
from sat_jax.team.lm_agent import LMAgent
from sat_jax.team.play import EpisodeRecord
from sat_jax.team.protocols import PROTOCOLS
from sat_jax.team.protocols import ProtocolConfig
from sat_jax.team.protocols import ROUTERS
from sat_jax.team.rollout import LMRollout
from sat_jax.team.rollout import make_rollout_fn
from sat_jax.team.rollout import RolloutResult
from sat_jax.team.speaker import ContextOverflowError
from sat_jax.team.transcript import Message
from sat_jax.team.transcript import TranscriptError
