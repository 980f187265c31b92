"""Toy games: exact J against hand values and brute-force enumeration."""

import itertools

import jax
import numpy as np
import pytest

from sat_jax import toy
from sat_jax.toy import games


def _onehot_logits(actions, num_actions, scale=60.0):
  return [scale * np.eye(num_actions)[[a]] for a in actions]


def test_matrix_game_exact_return_by_hand():
  climbing = toy.climbing_game()
  assert climbing.exact_return(climbing.init_params()) == pytest.approx(-31 / 9)
  penalty = toy.penalty_game(-10.0)
  assert penalty.exact_return(penalty.init_params()) == pytest.approx(2 / 9)
  # Deterministic joint actions pick the payoff entry.
  for a, b in [(0, 0), (0, 1), (2, 2)]:
    params = climbing.init_params(_onehot_logits([a, b], 3))
    assert climbing.exact_return(params) == pytest.approx(
        games.CLIMBING[a][b], abs=1e-12
    )
  # Three agents, non-square: p0 = (1/4, 3/4), others uniform.
  game = toy.matrix_game(np.arange(12.0).reshape(2, 3, 2))
  logits = [np.log([[0.25, 0.75]]), np.zeros((1, 3)), np.zeros((1, 2))]
  expected = 0.25 * np.mean(np.arange(6.0)) + 0.75 * np.mean(np.arange(6, 12.0))
  assert game.exact_return(game.init_params(logits)) == pytest.approx(expected)
  assert game.reward_bounds == (0.0, 11.0) and game.horizon == 1


def _brute_force(game, params):
  """J by enumerating every action and next-state sequence."""
  h, s, a = game.reward.shape
  total = 0.0
  for s0 in range(s):
    for path in itertools.product(range(a), range(s), repeat=h):
      prob, ret, state = game.init[s0], 0.0, s0
      for t in range(h):
        act, nxt = path[2 * t], path[2 * t + 1]
        prob *= (
            game.policy(params, t)[state, act]
            * game.transition[t, state, act, nxt]
        )
        ret += game.reward[t, state, act]
        state = nxt
      total += prob * ret
  return total


def test_sequential_game_backward_induction_matches_enumeration():
  rng = np.random.default_rng(0)
  transition = rng.dirichlet(np.ones(3), size=(3, 3, 2))  # stochastic
  reward = rng.normal(size=(3, 3, 2))
  game = toy.sequential_game(
      transition, reward, actor=(0, 1, 0), init_state=np.array([0.5, 0.5, 0.0])
  )
  assert [ag.num_states for ag in game.agents] == [6, 3] and game.horizon == 2
  params = game.init_params([rng.normal(size=(6, 2)), rng.normal(size=(3, 2))])
  assert game.exact_return(params) == pytest.approx(_brute_force(game, params))


def test_sequential_climbing_game():
  game = toy.sequential_climbing_game()
  assert game.reward_bounds == (-30.0, 11.0) and game.horizon == 1
  assert game.exact_return(game.init_params()) == pytest.approx(-31 / 9)
  best = game.init_params([60 * np.eye(3)[[0, 0, 0]]] * 2)
  assert game.exact_return(best) == pytest.approx(11.0, abs=1e-12)


def test_init_state_must_be_a_state_id_in_range():
  # Reward 1 only from state 2, so J(uniform) names the starting state.
  reward = np.zeros((1, 3, 2))
  reward[0, 2] = 1.0
  transition = np.zeros((1, 3, 2), int)
  for init, value in ((0, 0.0), (2, 1.0)):
    game = toy.sequential_game(transition, reward, (0,), init_state=init)
    np.testing.assert_array_equal(game.init, np.eye(3)[init])
    assert game.exact_return(game.init_params()) == value
  # -1 once started in state 2 (numpy's negative index), 3 was a bare
  # IndexError and 1.5 was truncated to state 1.
  for init in (-1, 3, 1.5):
    with pytest.raises(
        ValueError,
        match=rf"init_state={init}: a state id must be an integer in \[0, 3\)",
    ):
      toy.sequential_game(transition, reward, (0,), init_state=init)


@pytest.mark.parametrize(
    "make", [toy.climbing_game, toy.sequential_climbing_game]
)
def test_sampled_batch_is_consistent_with_the_exact_return(make):
  game = make()
  rng = np.random.default_rng(1)
  params = game.init_params(
      [rng.normal(size=(a.num_states, a.num_actions)) for a in game.agents]
  )
  batch = game.rollout_fn(512, 8)(params, jax.random.key(3))
  reward = np.asarray(batch.reward_E)
  # Mean of 4096 returns within 4 standard errors of the exact J.
  stderr = reward.std() / np.sqrt(reward.size)
  assert abs(reward.mean() - game.exact_return(params)) < 4 * stderr
  for k, view in enumerate(batch.views):
    mask = np.asarray(view.mask_ExT)
    assert mask.sum(1).tolist() == [1] * reward.size  # one action each
    logp = np.asarray(game.agents[k].token_logprobs(params[k], view.inputs))
    np.testing.assert_array_equal(
        logp[mask], np.asarray(view.behaviour_logp_ExT)[mask]
    )
  assert np.asarray(batch.group_E).tolist() == list(np.arange(4096) // 8)


def test_tabular_kl_and_log_probs():
  agent = toy.TabularAgent(2, 3)
  new = np.array([[0.0, 1.0, -1.0], [2.0, 0.0, 0.0]], np.float32)
  old = np.zeros((2, 3), np.float32)
  p = np.exp(new) / np.exp(new).sum(1, keepdims=True)
  kl = np.sum(p * np.log(p * 3), 1)
  inputs = {"state": np.array([[1, 0]]), "action": np.array([[0, 2]])}
  np.testing.assert_allclose(
      agent.state_kl(new, old, inputs), [[kl[1], kl[0]]], rtol=1e-6
  )
  np.testing.assert_allclose(
      agent.token_logprobs(new, inputs),
      [[np.log(p[1, 0]), np.log(p[0, 2])]],
      rtol=1e-6,
  )


def test_bad_games_are_rejected():
  with pytest.raises(ValueError, match="payoff must be a finite array"):
    toy.matrix_game([[1.0, np.nan]])
  with pytest.raises(ValueError, match="sum to 1"):
    toy.sequential_game(np.full((1, 2, 2, 2), 0.4), np.zeros((1, 2, 2)), (0,))
  with pytest.raises(ValueError, match="every agent 0..1 must act"):
    toy.sequential_game(np.zeros((2, 2, 2), int), np.zeros((2, 2, 2)), (1, 1))
  with pytest.raises(ValueError, match="group_size=1"):
    toy.climbing_game().rollout_fn(4, 1)
