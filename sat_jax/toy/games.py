"""Cooperative toy games with exact J(pi): matrix games and sequential games.

A new game is a few lines, through two public constructors:

  game = matrix_game(payoff)        # payoff array, one axis per agent
  game = sequential_game(transition, reward, actor)   # a small table

`matrix_game`: n agents act once, simultaneously, in one state; the team
reward is payoff[a_0, ..., a_{n-1}]. `sequential_game`: an H-step episode
from `init_state`; at step t only agent actor[t] acts (masked activation),
observing the state s, with action a; the reward reward[t, s, a] is added and
the next state follows transition[t, s, a] (an int table: deterministic, or
a probability table with a last axis over next states). Agent k has one
softmax row per (step where it acts, state).

Every game gives `agents` (tabular, see tabular.py), `init_params()`,
`exact_return(params)` (J by enumeration / backward induction, float64),
`reward_bounds`, `horizon` (most states one agent acts at per episode) and
`rollout_fn(num_groups, group_size)`: a function (params, key) -> TeamBatch
that samples num_groups x group_size episodes (groups are the "prompts").
"""

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from sat_jax.core import batch as batch_lib
from sat_jax.toy import tabular


def softmax(logits) -> np.ndarray:
  """Softmax over the last axis in float64 (for exact returns)."""
  x = np.asarray(logits, np.float64)
  x = np.exp(x - x.max(axis=-1, keepdims=True))
  return x / x.sum(axis=-1, keepdims=True)


class _Game:
  """Shared pieces: initial parameters and the batch assembly."""

  name: str
  agents: tuple[tabular.TabularAgent, ...]

  def init_params(
      self, logits: Sequence | None = None
  ) -> tuple[jax.Array, ...]:
    if logits is None:
      logits = (None,) * len(self.agents)
    if len(logits) != len(self.agents):
      raise ValueError(
          f"{len(logits)} logit tables for {len(self.agents)} agents"
      )
    return tuple(a.init_params(l) for a, l in zip(self.agents, logits))

  def rollout_fn(self, num_groups: int, group_size: int):
    """(params, key) -> TeamBatch of num_groups * group_size episodes."""
    if num_groups < 1 or group_size < 2:
      raise ValueError(
          f"num_groups={num_groups} must be >= 1 and group_size={group_size} "
          ">= 2"
      )
    num_e = num_groups * group_size
    # One jitted sampler per batch size, shared by every rollout_fn of the
    # game, so that new runs do not recompile it.
    samplers = self.__dict__.setdefault("_samplers", {})
    if num_e not in samplers:
      samplers[num_e] = jax.jit(
          functools.partial(self._sample, num_episodes=num_e)
      )
    sample = samplers[num_e]
    group_E = np.arange(num_e) // group_size
    n = len(self.agents)

    def rollout(params, key):
      state, action, agent_id, logp, reward = sample(tuple(params), key)
      return batch_lib.TeamBatch.from_shared(
          inputs={"state": state, "action": action},
          agent_id_ExT=agent_id,
          behaviour_logp_ExT=logp,
          loss_mask_ExT=np.ones(agent_id.shape, bool),
          reward_E=reward,
          group_E=group_E,
          num_agents=n,
          num_groups=num_groups,
      )

    return rollout


class MatrixGame(_Game):
  """n agents, one simultaneous action each; reward payoff[a_0..a_{n-1}]."""

  def __init__(self, payoff, name: str = "matrix"):
    payoff = np.asarray(payoff, np.float64)
    if payoff.ndim < 1 or payoff.size == 0 or not np.isfinite(payoff).all():
      raise ValueError(
          "payoff must be a finite array with one axis per agent, got shape "
          f"{payoff.shape}"
      )
    self.name = name
    self.payoff = payoff
    self.agents = tuple(tabular.TabularAgent(1, m) for m in payoff.shape)
    self.reward_bounds = (float(payoff.min()), float(payoff.max()))
    self.horizon = 1

  def exact_return(self, params) -> float:
    """J = sum_a prod_k pi_k(a_k) payoff[a] (exact, float64)."""
    value = self.payoff
    for logits in jax.device_get(tuple(params)):
      value = np.tensordot(softmax(np.asarray(logits)[0]), value, axes=(0, 0))
    return float(value)

  def _sample(self, params, key, num_episodes):
    n = len(self.agents)
    keys = jax.random.split(key, n)
    state_E = jnp.zeros((num_episodes,), jnp.int32)
    draws = [
        a.sample(p, state_E, k) for a, p, k in zip(self.agents, params, keys)
    ]
    action_ExN = jnp.stack([d[0] for d in draws], axis=1).astype(jnp.int32)
    logp_ExN = jnp.stack([d[1] for d in draws], axis=1)
    payoff = jnp.asarray(self.payoff, jnp.float32)
    reward_E = payoff[tuple(action_ExN[:, k] for k in range(n))]
    agent_ExN = jnp.broadcast_to(
        jnp.arange(n, dtype=jnp.int32), action_ExN.shape
    )
    return (
        jnp.zeros_like(action_ExN),
        action_ExN,
        agent_ExN,
        logp_ExN,
        reward_E,
    )


class SequentialGame(_Game):
  """H steps, one acting agent per step, tabular transitions and rewards."""

  def __init__(
      self, transition, reward, actor, init_state=0, name: str = "sequential"
  ):
    reward = np.asarray(reward, np.float64)
    if reward.ndim != 3 or not np.isfinite(reward).all():
      raise ValueError(
          f"reward must be a finite [H, S, A] table, got {reward.shape}"
      )
    h, s, a = reward.shape
    transition = np.asarray(transition)
    if transition.shape == (h, s, a) and np.issubdtype(
        transition.dtype, np.integer
    ):
      if transition.min() < 0 or transition.max() >= s:
        raise ValueError(f"transition next states must lie in [0, {s})")
      transition = np.eye(s)[transition]
    transition = np.asarray(transition, np.float64)
    if transition.shape != (h, s, a, s):
      raise ValueError(
          f"transition shape {transition.shape}: expected int [H, S, A] = "
          f"{(h, s, a)} or probabilities [H, S, A, S] = {(h, s, a, s)}"
      )
    if (transition < 0).any() or not np.allclose(transition.sum(-1), 1.0):
      raise ValueError("transition probabilities must be >= 0 and sum to 1")
    actor = np.asarray(actor, np.int64)
    if actor.shape != (h,) or actor.min() < 0:
      raise ValueError(f"actor must be [H={h}] agent ids >= 0, got {actor}")
    init = np.asarray(init_state)
    if init.ndim == 0:
      # Checked here: np.eye(s)[-1] would quietly start in the last state.
      if not (np.issubdtype(init.dtype, np.integer) and 0 <= init < s):
        raise ValueError(
            f"init_state={init_state!r}: a state id must be an integer in "
            f"[0, {s})"
        )
      init = np.eye(s)[int(init)]
    else:
      init = init.astype(np.float64)
    if init.shape != (s,) or (init < 0).any() or not np.isclose(init.sum(), 1):
      raise ValueError(
          f"init_state must be a state id or [S={s}] probabilities"
      )
    n = int(actor.max()) + 1
    steps_of = [np.flatnonzero(actor == k) for k in range(n)]
    if any(len(steps) == 0 for steps in steps_of):
      raise ValueError(f"actor={actor.tolist()}: every agent 0..{n-1} must act")
    self.name = name
    self.reward, self.transition, self.actor, self.init = (
        reward,
        transition,
        actor,
        init,
    )
    # Row of agent actor[t]'s table for state s at step t: slot(t) * S + s.
    self.slot = np.array(
        [list(steps_of[k]).index(t) for t, k in enumerate(actor)]
    )
    self.agents = tuple(tabular.TabularAgent(len(st) * s, a) for st in steps_of)
    self.horizon = max(len(st) for st in steps_of)
    self.reward_bounds = (
        self._extreme_return(np.min),
        self._extreme_return(np.max),
    )

  def _extreme_return(self, pick) -> float:
    h, s, _ = self.reward.shape
    value = np.zeros(s)
    for t in reversed(range(h)):
      reachable = self.transition[t] > 0  # [S, A, S']
      future = np.where(reachable, value[None, None, :], np.nan)
      best_next = (
          np.nanmax(future, -1) if pick is np.max else np.nanmin(future, -1)
      )
      value = pick(self.reward[t] + best_next, axis=-1)
    return float(pick(value[self.init > 0]))

  def policy(self, params, t: int) -> np.ndarray:
    """pi_SxA of the agent acting at step t (float64)."""
    s = self.reward.shape[1]
    rows = np.asarray(jax.device_get(params[self.actor[t]]))[
        self.slot[t] * s : (self.slot[t] + 1) * s
    ]
    return softmax(rows)

  def exact_return(self, params) -> float:
    """J by backward induction: V_t(s) = sum_a pi(a|s)(r + P V_{t+1})."""
    h, s, _ = self.reward.shape
    value = np.zeros(s)
    for t in reversed(range(h)):
      q_SxA = self.reward[t] + self.transition[t] @ value
      value = np.sum(self.policy(params, t) * q_SxA, axis=-1)
    return float(self.init @ value)

  def _sample(self, params, key, num_episodes):
    h, s, _ = self.reward.shape
    reward_tab = jnp.asarray(self.reward, jnp.float32)
    log_p = jnp.log(jnp.asarray(self.transition, jnp.float32))
    key, k0 = jax.random.split(key)
    state_E = jax.random.categorical(
        k0, jnp.log(jnp.asarray(self.init, jnp.float32)), shape=(num_episodes,)
    )
    rows, actions, logps = [], [], []
    reward_E = jnp.zeros((num_episodes,), jnp.float32)
    for t in range(h):
      key, k_act, k_next = jax.random.split(key, 3)
      k = int(self.actor[t])
      row_E = int(self.slot[t]) * s + state_E
      action_E, logp_E = self.agents[k].sample(params[k], row_E, k_act)
      reward_E = reward_E + reward_tab[t, state_E, action_E]
      rows.append(row_E)
      actions.append(action_E)
      logps.append(logp_E)
      state_E = jax.random.categorical(
          k_next, log_p[t, state_E, action_E], axis=-1
      )
    stack = lambda xs: jnp.stack(xs, axis=1)
    agent_ExH = jnp.broadcast_to(
        jnp.asarray(self.actor, jnp.int32), (num_episodes, h)
    )
    return (
        stack(rows).astype(jnp.int32),
        stack(actions).astype(jnp.int32),
        agent_ExH,
        stack(logps),
        reward_E,
    )


def matrix_game(payoff, name: str = "matrix") -> MatrixGame:
  """A cooperative matrix game from a payoff array with one axis per agent."""
  return MatrixGame(payoff, name)


def sequential_game(
    transition, reward, actor, init_state=0, name: str = "sequential"
) -> SequentialGame:
  """An H-step game from transition/reward tables and the actor per step."""
  return SequentialGame(transition, reward, actor, init_state, name)


CLIMBING = ((11, -30, 0), (-30, 7, 6), (0, 0, 5))


def climbing_game() -> MatrixGame:
  """Claus & Boutilier (1998): optimum 11 at (0, 0), guarded by -30s."""
  return matrix_game(CLIMBING, "climbing")


def penalty_game(k: float = -10.0) -> MatrixGame:
  """Two optima (10) whose miscoordination costs k; a safe 2 in the middle."""
  return matrix_game(((10, 0, k), (0, 2, 0), (k, 0, 10)), "penalty")


def coordination_game(num_actions: int = 2) -> MatrixGame:
  """Reward 1 when both agents pick the same action, else 0."""
  return matrix_game(np.eye(num_actions), f"coordination{num_actions}")


def sequential_climbing_game() -> SequentialGame:
  """2 steps: agent 0 picks a row (the state), agent 1 sees it, picks a column.

  Reward CLIMBING[row, column]. Agent 1 can best-respond per row, but while
  it is uniform the optimal row 0 looks worst to agent 0 (the trap).
  """
  climbing = np.asarray(CLIMBING, np.float64)
  transition = np.zeros((2, 3, 3), np.int64)
  transition[0] = np.arange(3)[None, :]  # state after step 0 = agent 0's action
  reward = np.zeros((2, 3, 3))
  reward[1] = climbing
  return sequential_game(
      transition, reward, actor=(0, 1), init_state=0, name="sequential_climbing"
  )
