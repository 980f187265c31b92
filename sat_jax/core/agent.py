"""The agent protocol, the per-agent training state and the team state.

An agent is a static, hashable object (a frozen dataclass holding only its
architecture: an LM's ModelConfig and temperature, or a table's shape) whose
methods are pure functions of parameters and inputs:

  token_logprobs(params, inputs) -> logp_ExT
      log pi(a_t | s_t) of the given action at every position t.
  state_kl(params_new, params_old, inputs) -> kl_ExT
      the exact KL(pi_new(.|s_t) || pi_old(.|s_t)) over the whole action set
      at the state of every position t, aligned with token_logprobs and
      differentiable w.r.t. params_new (it is the penalty term).

An agent may also offer

  logprobs_and_kl(params_new, params_old, inputs) -> (logp_ExT, kl_ExT)
      token_logprobs(params_new, inputs) and state_kl(params_new,
      params_old, inputs) in one pass (an LM runs its body on params_new
      once instead of twice); the core uses it when present
      (`logprobs_and_kl` below).
  kl_reference(params_old, inputs) -> reference
      what the KL needs of params_old that does not change while params_new
      does (an LM: its hidden states), every leaf with leading axis E; the
      core then computes it once per update try and passes it, sliced with
      the inputs, as logprobs_and_kl(..., reference=reference) (the agent
      must then offer that keyword), instead of a pass over params_old in
      every minibatch step.

Positions where the agent does not act may hold anything finite: the team
batch masks them out. Sampling is the rollout's business (see
`sat_jax.toy` for a tabular example); the SAT core never samples.

The team state is a tuple with one `AgentState` per agent. Only the agent
being updated enters its jitted update; the others reach it through arrays
(advantages, truncated weights) precomputed from the batch.
"""

from typing import Any, Protocol, Sequence, runtime_checkable

from flax import struct
import jax
import numpy as np
import optax

from sat_jax import multihost
from sat_jax.core import config as config_lib

PyTree = Any


@runtime_checkable
class Agent(Protocol):
  """What the SAT core needs from an agent (see the module docstring)."""

  def token_logprobs(self, params: PyTree, inputs: PyTree) -> jax.Array:
    ...

  def state_kl(
      self, params_new: PyTree, params_old: PyTree, inputs: PyTree
  ) -> jax.Array:
    ...


def kl_reference(agent: Agent, params_old: PyTree, inputs: PyTree) -> Any:
  """The agent's `kl_reference` of params_old, or None if it has none."""
  fn = getattr(agent, "kl_reference", None)
  return None if fn is None else fn(params_old, inputs)


def logprobs_and_kl(
    agent: Agent,
    params_new: PyTree,
    params_old: PyTree,
    inputs: PyTree,
    reference: Any = None,
) -> tuple[jax.Array, jax.Array]:
  """(logp_ExT, kl_ExT) of params_new: the agent's fused pass if it has one.

  `reference`: `kl_reference(agent, params_old, inputs)` (None: none).
  """
  fused = getattr(agent, "logprobs_and_kl", None)
  if reference is not None:
    return fused(params_new, params_old, inputs, reference=reference)
  if fused is not None:
    return fused(params_new, params_old, inputs)
  return (
      agent.token_logprobs(params_new, inputs),
      agent.state_kl(params_new, params_old, inputs),
  )


@struct.dataclass
class AgentState:
  """One agent's trainable state: params, optimizer state, beta and delta."""

  params: PyTree
  opt_state: PyTree
  beta: jax.Array  # float32 scalar: KL-penalty coefficient, adapted online
  delta: jax.Array  # float32 scalar: per-state KL radius delta_i


TeamState = tuple[AgentState, ...]


def make_optimizer(
    cfg: config_lib.OptimizerConfig,
) -> optax.GradientTransformation:
  """The optax chain of one agent: [global-norm clip] then the optimizer."""
  if cfg.name == "adamw":
    opt = optax.adamw(
        cfg.learning_rate,
        cfg.b1,
        cfg.b2,
        cfg.eps,
        weight_decay=cfg.weight_decay,
    )
  elif cfg.name == "adam":
    opt = optax.adam(cfg.learning_rate, cfg.b1, cfg.b2, cfg.eps)
  else:
    opt = optax.sgd(cfg.learning_rate)
  if cfg.grad_clip is None:
    return opt
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt)


def check_agents(agents: Sequence[Any]) -> None:
  """Raises TypeError unless every agent is hashable and has both methods."""
  for i, agent in enumerate(agents):
    if not isinstance(agent, Agent):
      raise TypeError(
          f"agent {i} ({type(agent).__name__}) lacks token_logprobs/state_kl"
      )
    has_reference = getattr(agent, "kl_reference", None) is not None
    if has_reference and getattr(agent, "logprobs_and_kl", None) is None:
      raise TypeError(
          f"agent {i} ({type(agent).__name__}) offers kl_reference without"
          " logprobs_and_kl(..., reference=), which the core passes it to"
      )
    try:
      hash(agent)
    except TypeError as e:
      raise TypeError(
          f"agent {i} ({type(agent).__name__}) is not hashable: agents are "
          "static jit arguments (use a frozen dataclass)"
      ) from e


def init_team(
    agents: Sequence[Any],
    params: Sequence[PyTree],
    cfg: config_lib.SATConfig,
) -> TeamState:
  """Builds the team state: optimizer state, beta_init and delta per agent."""
  check_agents(agents)
  if len(params) != len(agents):
    raise ValueError(
        f"{len(params)} parameter sets for a team of {len(agents)} agents"
    )
  if cfg.method == "single" and cfg.single_agent >= len(agents):
    raise ValueError(
        f"single_agent={cfg.single_agent} exceeds the team of {len(agents)}"
    )
  # Jitted so that the optimizer state follows the params' placement and no
  # implicit host transfer happens (the code runs under transfer_guard).
  opt_init = jax.jit(make_optimizer(cfg.update.optimizer).init)
  deltas = cfg.agent_deltas(len(agents))
  betas = cfg.agent_beta_inits(len(agents))
  return tuple(
      AgentState(
          params=p,
          opt_state=opt_init(p),
          beta=scalar(b),
          delta=scalar(d),
      )
      for p, b, d in zip(params, betas, deltas)
  )


def scalar(x: float) -> jax.Array:
  """A float32 device scalar, transferred explicitly (replicated on a mesh)."""
  return multihost.put_replicated(np.float32(x))


def team_params(team: TeamState) -> tuple[PyTree, ...]:
  """The parameters of every agent, in team order (what rollouts need)."""
  return tuple(state.params for state in team)
