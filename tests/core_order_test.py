"""ORDERAGENTS: named orders, seeded random, greedy by a measured gain."""

import jax
import numpy as np
import pytest

from sat_jax.core import agent as agent_lib
from sat_jax.core import config as C
from sat_jax.core import order as order_lib
from sat_jax.core import stage
from sat_jax.toy import games


def test_static_reverse_and_explicit():
  assert order_lib.order_agents("static", 4) == (0, 1, 2, 3)
  assert order_lib.order_agents("reverse", 4) == (3, 2, 1, 0)
  assert order_lib.order_agents((2, 0, 1), 3) == (2, 0, 1)
  with pytest.raises(ValueError, match="not a permutation"):
    order_lib.order_agents((0, 1, 1), 3)
  with pytest.raises(ValueError, match="order='best' is not one of"):
    order_lib.order_agents("best", 3)


def test_random_is_a_seeded_permutation():
  orders = [
      order_lib.order_agents("random", 5, jax.random.key(k)) for k in range(20)
  ]
  assert all(sorted(o) == list(range(5)) for o in orders)
  assert len(set(orders)) > 1
  again = [
      order_lib.order_agents("random", 5, jax.random.key(k)) for k in range(20)
  ]
  assert orders == again
  with pytest.raises(ValueError, match="needs a PRNG key"):
    order_lib.order_agents("random", 5)


def test_greedy_sorts_by_gain_and_never_falls_back():
  assert order_lib.order_agents("greedy", 4, None, [0.1, 3.0, 0.1, 2.0]) == (
      1,
      3,
      0,
      2,
  )
  with pytest.raises(ValueError, match="needs the predicted gain"):
    order_lib.order_agents("greedy", 3)
  with pytest.raises(ValueError, match="not 3 finite values"):
    order_lib.order_agents("greedy", 3, None, [1.0, float("nan"), 2.0])


def test_greedy_stage_puts_the_irrelevant_agent_last():
  # Agent 0's action does not change the reward, so its surrogate gradient is
  # 0; agent 1's matters. Static order would update agent 0 first.
  payoff = np.array([[0.0, 1.0, 3.0], [0.0, 1.0, 3.0]])
  game = games.matrix_game(payoff)
  cfg = C.SATConfig(order="greedy", certificate=None)
  team = agent_lib.init_team(game.agents, game.init_params(), cfg)
  _, record = stage.run_stage(
      game.agents, team, game.rollout_fn(4, 4), cfg, jax.random.key(0)
  )
  assert record.order == (1, 0)
