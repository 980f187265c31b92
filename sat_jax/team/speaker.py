"""The LM speaker: renders each agent's turn, samples it in one batched call.

For one turn of agent k over its requests (the episodes where k speaks), on
the host: render every chat with k's template (cached), take each stream's
delta (transcript.py), tokenise all deltas in one batch call, append them;
then one jitted `sampling.sample` call for all those rows, padded to a
bucketed row count (powers of two, a multiple of the mesh's batch shards,
filler rows copying the first real row so that early stopping still works)
and a bucketed prompt length. `finish` pulls the samples to the host,
appends each row's ids and log-probs to its stream verbatim and decodes the
message texts in one batch call.

Sampling options: in training (`training=True`) they are the agent's own
(`training_options`): temperature = the agent's training temperature, top-k
and top-p off, so that behaviour log-probs are exactly what `LMAgent`
recomputes (DESIGN §3); this is checked. Evaluation may pass other options.

Under a mesh (`jax.set_mesh`), prompt rows are placed over the logical
"batch" axis (("data", "fsdp") by default); parameters stay as the caller
sharded them. A speaker given its own `sampling_mesh` samples there
instead: `reset` copies each agent's parameters onto that mesh (sharded by
their logical axes under `sampling_rules`, i.e. replicated over a data-only
mesh) and every sampler call runs under it, whatever mesh the caller is in;
what `finish` returns is host data, so the batch built from it lands on the
caller's (training) mesh. On CPU hosts a sampler mesh over two devices with
the training on one runs two decode streams side by side, one per core
(the decode step's small matmuls split badly across cores within one op).
"""

import contextlib
import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import numpy as np

from sat_jax import models
from sat_jax import multihost
from sat_jax import sampling
from sat_jax import sharding
from sat_jax.team import lm_agent as lm_agent_lib
from sat_jax.team import play
from sat_jax.team import protocols
from sat_jax.team import transcript as transcript_lib

PyTree = Any
_REPLICATED = jax.sharding.PartitionSpec()


class ContextOverflowError(ValueError):
  """An agent's prompt plus max_new_tokens exceeds its context."""


def agent_buckets(
    cfg: protocols.ProtocolConfig, config: models.ModelConfig
) -> tuple[int, ...]:
  """Prompt buckets of one agent: those that fit, then the context's rest."""
  cap = config.max_seq_len - cfg.max_new_tokens
  if cap < 1:
    raise ContextOverflowError(
        f"max_new_tokens={cfg.max_new_tokens} leaves no prompt room in"
        f" max_seq_len={config.max_seq_len}"
    )
  fit = tuple(b for b in cfg.prompt_buckets if b < cap)
  return fit + (cap,)


def training_options(
    agent: lm_agent_lib.LMAgent,
    renderer: transcript_lib.Renderer,
    cfg: protocols.ProtocolConfig,
) -> sampling.SamplingOptions:
  """The agent's rollout distribution: its temperature, no top-k / top-p."""
  return sampling.SamplingOptions(
      max_new_tokens=cfg.max_new_tokens,
      temperature=agent.temperature,
      top_p=1.0,
      top_k=0,
      stop_token_ids=renderer.stop_ids,
      pad_token_id=renderer.pad_id,
      prompt_buckets=agent_buckets(cfg, agent.config),
  )


def check_training_options(
    k: int, agent: lm_agent_lib.LMAgent, options: sampling.SamplingOptions
) -> None:
  """Raises unless sampling with `options` is the agent's scored policy."""
  if (
      options.temperature != agent.temperature
      or options.top_k != 0
      or options.top_p != 1.0
  ):
    raise ValueError(
        f"agent {k}: training rollouts must sample at the agent's"
        f" temperature {agent.temperature} with top_k=0 and top_p=1 (got"
        f" temperature={options.temperature}, top_k={options.top_k},"
        f" top_p={options.top_p}): the behaviour log-probs must be the ones"
        " the trainer recomputes"
    )


def row_bucket(rows: int, total: int, min_rows: int, multiple: int) -> int:
  """Rows of a sampler call: pow2 >= rows, >= min_rows, <= total, x multiple."""
  b = max(1 << max(rows - 1, 0).bit_length(), min_rows)
  b = min(b, total)
  return -(-b // multiple) * multiple


def batch_sharding(shape: tuple[int, ...]):
  """Rows over the logical "batch" axis under the current mesh, else None."""
  mesh = jax.sharding.get_mesh()
  if mesh.empty:
    return None
  names = ("batch",) + (None,) * (len(shape) - 1)
  return sharding.logical_to_sharding(
      names, mesh, shapes=jax.ShapeDtypeStruct(shape, np.int32)
  )


def batch_multiple() -> int:
  """How many shards the batch rows are split into under the current mesh."""
  mesh = jax.sharding.get_mesh()
  if mesh.empty:
    return 1
  axes = sharding.logical_to_spec(("batch",))[0] or ()
  axes = (axes,) if isinstance(axes, str) else axes
  return math.prod(dict(mesh.shape).get(a, 1) for a in axes)


@dataclasses.dataclass
class _Handle:
  agent: int
  requests: Sequence[play.Request]
  rows: list[int]  # request positions that were sampled
  output: sampling.SampleOutput | None


class LMSpeaker:
  """A `play.Speaker` over LM agents; holds every episode's streams."""

  def __init__(
      self,
      agents: Sequence[lm_agent_lib.LMAgent],
      renderers: Sequence[transcript_lib.Renderer],
      options: Sequence[sampling.SamplingOptions],
      cfg: protocols.ProtocolConfig,
      *,
      training: bool,
      sampling_mesh: jax.sharding.Mesh | None = None,
      sampling_rules: sharding.LogicalRules | None = None,
  ):
    if not len(agents) == len(renderers) == len(options):
      raise ValueError(
          f"{len(agents)} agents, {len(renderers)} renderers and"
          f" {len(options)} sampling options"
      )
    if training:
      for k, (agent, opt) in enumerate(zip(agents, options)):
        if hasattr(agent, "sample"):
          raise ValueError(
              f"agent {k} ({type(agent).__name__}) samples with its own"
              " function and cannot be trained: evaluation only"
          )
        check_training_options(k, agent, opt)
    self.agents, self.renderers, self.options = agents, renderers, options
    self.cfg = cfg
    self.sampling_mesh = sampling_mesh
    self.sampling_rules = (
        sharding.DEFAULT_RULES if sampling_rules is None else sampling_rules
    )
    self.params: tuple[PyTree, ...] = ()
    self.streams: list[list[transcript_lib.Stream]] = []
    self.timing = {"render_s": 0.0, "sample_s": 0.0, "decode_s": 0.0}
    self.calls = 0

  def reset(self, params: Sequence[PyTree], num_episodes: int) -> None:
    """New episodes under `params` (one pytree per agent)."""
    if len(params) != len(self.agents):
      raise ValueError(
          f"{len(params)} parameter sets for {len(self.agents)} agents"
      )
    self.params = tuple(
        self._placed(agent, p) for agent, p in zip(self.agents, params)
    )
    self.streams = [
        [transcript_lib.Stream() for _ in self.agents]
        for _ in range(num_episodes)
    ]
    for r in {id(r): r for r in self.renderers}.values():
      r.clear_cache()
    self.timing = dict.fromkeys(self.timing, 0.0)
    self.calls = 0

  def _placed(self, agent, params: PyTree):
    """An agent's params on the sampling mesh (a pair for a ProductAgent)."""
    configs = getattr(agent, "param_configs", None)
    if configs is None:
      return self._to_sampling_mesh(agent.config, params)
    if len(params) != len(configs):
      raise ValueError(
          f"{type(agent).__name__} takes {len(configs)} parameter sets, got"
          f" {len(params)}"
      )
    return tuple(self._to_sampling_mesh(c, p) for c, p in zip(configs, params))

  def _to_sampling_mesh(self, config: models.ModelConfig, params: PyTree):
    if self.sampling_mesh is None:
      return params
    shardings = sharding.logical_to_sharding(
        models.param_axes(config),
        self.sampling_mesh,
        self.sampling_rules,
        shapes=params,
    )
    return jax.device_put(params, shardings)

  @contextlib.contextmanager
  def _on_sampling_mesh(self):
    """The sampling mesh and its rules as the current ones (if any)."""
    if self.sampling_mesh is None:
      yield
      return
    with jax.set_mesh(self.sampling_mesh):
      with sharding.logical_rules(self.sampling_rules):
        yield

  def start(self, agent: int, requests: Sequence[play.Request], key):
    t0 = time.perf_counter()
    renderer, who = self.renderers[agent], f"agent {agent}"
    streams = [self.streams[q.episode][agent] for q in requests]
    chats = [renderer.chat(q.messages, agent) for q in requests]
    rendered = renderer.render(chats, who)
    deltas = [
        s.delta(text, who, renderer.template)
        for s, text in zip(streams, rendered)
    ]
    delta_ids = renderer.encode(deltas)
    rows = self._fitting_rows(agent, requests, streams, delta_ids)
    for i in rows:
      streams[i].add_context(rendered[i], delta_ids[i])
    t1 = time.perf_counter()
    with self._on_sampling_mesh():
      output = self._sample(agent, [streams[i].tokens() for i in rows], key)
    self.timing["render_s"] += t1 - t0
    self.timing["sample_s"] += time.perf_counter() - t1
    return _Handle(agent, requests, rows, output)

  def _fitting_rows(self, agent, requests, streams, delta_ids) -> list[int]:
    """Rows whose prompt + max_new_tokens fit (overflow policy for others)."""
    config = self.agents[agent].config
    n = self.options[agent].max_new_tokens
    rows = []
    for i, (q, s, ids) in enumerate(zip(requests, streams, delta_ids)):
      prompt = s.length + len(ids)
      if prompt + n <= config.max_seq_len:
        rows.append(i)
      elif self.cfg.overflow == "error":
        raise ContextOverflowError(
            f"agent {agent}: episode {q.episode} (round {q.round}) needs a"
            f" prompt of {prompt} tokens + max_new_tokens {n} ="
            f" {prompt + n} > max_seq_len {config.max_seq_len}; lower"
            " rounds or max_new_tokens, or set overflow='stop'"
        )
    return rows

  def _sample(self, agent: int, prompts: list[np.ndarray], key):
    if not prompts:
      return None
    opts = self.options[agent]
    multiple = batch_multiple()
    b = row_bucket(len(prompts), len(self.streams), self.cfg.min_rows, multiple)
    p = sampling.bucket_length(
        max(len(x) for x in prompts), opts.prompt_buckets
    )
    tokens = np.full((b, p), opts.pad_token_id, np.int32)
    mask = np.zeros((b, p), np.int32)
    for i in range(b):
      ids = prompts[i] if i < len(prompts) else prompts[0]
      tokens[i, p - len(ids) :], mask[i, p - len(ids) :] = ids, 1
    where = batch_sharding((b, p))
    tokens, mask = jax.device_put((tokens, mask), where)
    if self.sampling_mesh is not None:  # the caller's key may live elsewhere
      key = jax.device_put(
          key, jax.sharding.NamedSharding(self.sampling_mesh, _REPLICATED)
      )
    self.calls += 1
    own = getattr(self.agents[agent], "sample", None)  # e.g. a ProductAgent
    if own is not None:
      return own(self.params[agent], tokens, mask, opts, key)
    return sampling.sample(
        self.agents[agent].config,
        self.params[agent],
        tokens,
        mask,
        opts,
        key,
    )

  def finish(self, handle: _Handle) -> list[str | None]:
    texts: list[str | None] = [None] * len(handle.requests)
    if handle.output is None:
      return texts
    t0 = time.perf_counter()
    out = handle.output
    # The rows may be spread over other processes' devices (multi-host).
    tokens, logps, lengths = multihost.to_host(
        (out.tokens_BxN, out.logprobs_BxN, out.lengths_B)
    )
    t1 = time.perf_counter()
    renderer = self.renderers[handle.agent]
    stops = np.asarray(renderer.stop_ids, np.int32)
    contents, stopped = [], []
    for j in range(len(handle.rows)):
      n = int(lengths[j])
      hit = n > 0 and bool(np.isin(tokens[j, n - 1], stops))
      stopped.append(int(tokens[j, n - 1]) if hit else None)
      contents.append(tokens[j, : n - 1] if hit else tokens[j, :n])
    for j, (i, text) in enumerate(zip(handle.rows, renderer.decode(contents))):
      q = handle.requests[i]
      n = int(lengths[j])
      stop = None if stopped[j] is None else renderer.stop_texts[stopped[j]]
      self.streams[q.episode][handle.agent].add_action(
          tokens[j, :n], logps[j, :n], text, stop
      )
      texts[i] = text
    self.timing["sample_s"] += t1 - t0
    self.timing["decode_s"] += time.perf_counter() - t1
    return texts
