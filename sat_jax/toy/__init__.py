"""Exact toy teams: tabular softmax agents on games with exact J(pi).

Make your own game in a few lines and train SAT on it:

  from sat_jax import core, toy
  game = toy.matrix_game([[1, 0], [0, 2]])   # one payoff axis per agent
  # or toy.sequential_game(transition, reward, actor)   (see games.py)
  cfg = core.SATConfig(
      delta=0.05, certificate=toy.certificate_config(game),
      update=core.UpdateConfig(
          epochs=4, optimizer=core.OptimizerConfig("adam", 0.1)))
  run = toy.run_toy(game, cfg, num_stages=50, seed=0, num_groups=8,
                    group_size=8)
  run.returns                 # exact J before and after every stage
  run.bounds["episodic"]      # the certificate's lower bound per stage
"""

from sat_jax.toy.games import climbing_game
from sat_jax.toy.games import coordination_game
from sat_jax.toy.games import matrix_game
from sat_jax.toy.games import MatrixGame
from sat_jax.toy.games import penalty_game
from sat_jax.toy.games import sequential_climbing_game
from sat_jax.toy.games import sequential_game
from sat_jax.toy.games import SequentialGame
from sat_jax.toy.tabular import TabularAgent
from sat_jax.toy.train import certificate_config
from sat_jax.toy.train import run_toy
from sat_jax.toy.train import ToyRun
