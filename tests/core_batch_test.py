"""The team batch: per-agent views from a shared token array, validation."""

import numpy as np
import pytest

from sat_jax.core import batch as batch_lib


def _shared(agent_id, num_agents=2, group=(0, 0, 1, 1)):
  agent_id = np.asarray(agent_id)
  return batch_lib.TeamBatch.from_shared(
      inputs={"tokens": np.arange(agent_id.size).reshape(agent_id.shape)},
      agent_id_ExT=agent_id,
      behaviour_logp_ExT=-np.ones(agent_id.shape),
      loss_mask_ExT=np.array([[1, 1, 1]] * 3 + [[1, 1, 0]], bool),
      reward_E=np.array([1.0, 0.0, 1.0, 1.0]),
      group_E=np.asarray(group),
      num_agents=num_agents,
  )


IDS = [[-1, 0, 1], [0, 1, 1], [1, 0, -1], [0, 0, 1]]


def test_from_shared_masks_are_own_positions_and_loss_mask():
  batch = _shared(IDS)
  assert batch.num_groups == 2 and batch.num_episodes == 4
  np.testing.assert_array_equal(
      batch.views[0].mask_ExT,
      [[0, 1, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]],
  )
  # Episode 3's last position is agent 1's but outside the loss mask.
  np.testing.assert_array_equal(
      batch.views[1].mask_ExT,
      [[0, 0, 1], [0, 1, 1], [1, 0, 0], [0, 0, 0]],
  )
  batch_lib.validate_batch(batch, num_agents=2, minibatches=2)


@pytest.mark.parametrize("bad", [2, -2])
def test_agent_ids_outside_the_team_are_named(bad):
  ids = np.array(IDS)
  ids[2, 1] = bad
  with pytest.raises(
      ValueError, match=f"agent id {bad} at episode 2, position 1"
  ):
    _shared(ids)


def test_group_of_one_episode_is_rejected():
  batch = _shared(IDS, group=(0, 0, 0, 1))
  with pytest.raises(ValueError, match="group 1 has 1 episode"):
    batch_lib.validate_batch(batch, num_agents=2, minibatches=1)


def test_team_size_and_minibatch_split_are_checked():
  batch = _shared(IDS)
  with pytest.raises(ValueError, match="2 agent views for a team of 3"):
    batch_lib.validate_batch(batch, num_agents=3, minibatches=1)
  with pytest.raises(ValueError, match="minibatches=3"):
    batch_lib.validate_batch(batch, num_agents=2, minibatches=3)
