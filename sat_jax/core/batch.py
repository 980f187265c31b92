"""The team batch: per-agent views of E episodes, plus reward and group id.

Agents of one team may tokenise an episode differently (different tokenizers
and sizes), so the batch holds one `AgentView` per agent: agent k's inputs for
every episode (any pytree whose leaves have leading axis E, e.g. tokens_ExT_k
in k's tokenizer), the mask of k's own action positions (False where k is
inactive: it contributes nothing there) and the stage-start behaviour
log-probs of those positions. Per episode: the reward (the return) and the
group id (episodes of one prompt). T may differ between views.

The common case (toy games, same-tokenizer LM teams) is one shared token
array with the acting agent's id per position: `TeamBatch.from_shared`.
"""

from typing import Any

from flax import struct
import jax
import numpy as np

from sat_jax import multihost

PyTree = Any
NO_AGENT = -1  # agent id of positions no agent acts at (prompt, env, pad)


@struct.dataclass
class AgentView:
  """Agent k's view of the batch; every leaf has leading axis E."""

  inputs: PyTree
  mask_ExT: jax.Array  # bool: k's own action positions (and loss mask)
  behaviour_logp_ExT: jax.Array  # float32: stage-start log pi_k(a_t|s_t)


@struct.dataclass
class TeamBatch:
  """E episodes of a team: one view per agent, reward_E and group_E."""

  views: tuple[AgentView, ...]
  reward_E: jax.Array  # float32: episode return
  group_E: jax.Array  # int32 in [0, num_groups): the prompt group
  num_groups: int = struct.field(pytree_node=False)

  @property
  def num_episodes(self) -> int:
    return self.reward_E.shape[0]

  @classmethod
  def from_shared(
      cls,
      inputs: PyTree,
      agent_id_ExT: Any,
      behaviour_logp_ExT: Any,
      loss_mask_ExT: Any,
      reward_E: Any,
      group_E: Any,
      num_agents: int,
      num_groups: int | None = None,
  ) -> "TeamBatch":
    """One shared token array with the acting agent per position.

    Agent k's mask is `loss_mask & (agent_id == k)`; ids must lie in
    [-1, num_agents) (-1: no agent). Call it with concrete arrays (outside
    jit): the ids are checked here, before any work.
    """
    ids = np.asarray(multihost.to_host(agent_id_ExT))
    bad = (ids < NO_AGENT) | (ids >= num_agents)
    if bad.any():
      e, t = np.argwhere(bad)[0]
      raise ValueError(
          f"agent id {ids[e, t]} at episode {e}, position {t} is outside the "
          f"team of {num_agents} agents (valid: {NO_AGENT} for no agent, "
          f"0..{num_agents - 1})"
      )
    loss_mask = np.asarray(multihost.to_host(loss_mask_ExT), bool)
    if loss_mask.shape != ids.shape:
      raise ValueError(
          f"loss mask shape {loss_mask.shape} != agent id shape {ids.shape}"
      )
    behaviour = _on_device(behaviour_logp_ExT, np.float32)
    views = tuple(
        AgentView(
            inputs=inputs,
            mask_ExT=jax.device_put(loss_mask & (ids == k)),
            behaviour_logp_ExT=behaviour,
        )
        for k in range(num_agents)
    )
    group = np.asarray(multihost.to_host(group_E), np.int32)
    if num_groups is None:
      num_groups = int(group.max()) + 1 if group.size else 0
    return cls(
        views=views,
        reward_E=_on_device(reward_E, np.float32),
        group_E=jax.device_put(group),
        num_groups=num_groups,
    )


def _on_device(x: Any, dtype) -> jax.Array:
  """x as a device array of dtype, with only explicit transfers."""
  if isinstance(x, jax.Array):
    return x if x.dtype == dtype else x.astype(dtype)
  return jax.device_put(np.asarray(x, dtype))


def validate_batch(batch: TeamBatch, num_agents: int, minibatches: int) -> None:
  """Checks shapes, ids and group sizes; raises ValueError naming the value."""
  if len(batch.views) != num_agents:
    raise ValueError(
        f"batch has {len(batch.views)} agent views for a team of {num_agents}"
    )
  num_e = batch.reward_E.shape
  if len(num_e) != 1 or batch.group_E.shape != num_e:
    raise ValueError(
        f"reward_E shape {batch.reward_E.shape} and group_E shape "
        f"{batch.group_E.shape} must both be [E]"
    )
  num_e = num_e[0]
  for k, view in enumerate(batch.views):
    mask_shape = view.mask_ExT.shape
    if len(mask_shape) != 2 or mask_shape[0] != num_e:
      raise ValueError(
          f"agent {k}: mask shape {mask_shape} is not [E={num_e}, T]"
      )
    if view.behaviour_logp_ExT.shape != mask_shape:
      raise ValueError(
          f"agent {k}: behaviour log-prob shape "
          f"{view.behaviour_logp_ExT.shape} != mask shape {mask_shape}"
      )
    for leaf in jax.tree.leaves(view.inputs):
      if not leaf.shape or leaf.shape[0] != num_e:
        raise ValueError(
            f"agent {k}: an input leaf has shape {leaf.shape}, not [E={num_e},"
            " ...]"
        )
  if num_e % minibatches:
    raise ValueError(
        f"E={num_e} episodes do not split into minibatches={minibatches}"
    )
  group = np.asarray(multihost.to_host(batch.group_E))
  if group.size and (group.min() < 0 or group.max() >= batch.num_groups):
    raise ValueError(
        f"group ids span [{group.min()}, {group.max()}], outside "
        f"[0, num_groups={batch.num_groups})"
    )
  sizes = np.bincount(group, minlength=batch.num_groups)
  if (sizes < 2).any():
    g = int(np.argmax(sizes < 2))
    raise ValueError(
        f"group {g} has {sizes[g]} episode(s): group size must be >= 2 for a "
        "group-relative advantage"
    )
