"""SAT on exact toy teams: the statistical claims, on reduced sizes.

Thresholds come from the claims, not from observed runs: "J decreases in at
most 5% of stages" is rejected only if the count of decreasing stages exceeds
the 99.9% quantile of Binomial(K, 0.05); the certificate must hold in every
stage and every step. The full-size runs live in experiments/toy_teams.py
(and the slow test at the end runs it).
"""

import pathlib
import sys

import numpy as np
import pytest
from scipy import optimize
from scipy import stats

from sat_jax import toy
from sat_jax.toy import exact
from sat_jax.toy import games

_REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_REPO / "experiments"))
import toy_teams  # pylint: disable=g-import-not-at-top,wrong-import-position

SEEDS, STAGES = (0, 1), 30


@pytest.mark.parametrize("name", sorted(toy_teams.GAMES))
def test_monotonic_improvement_and_certificate(name):
  game = toy_teams.GAMES[name]()
  cfg = toy_teams.small_delta_config(game)
  runs = [
      toy.run_toy(
          game, cfg, num_stages=STAGES, seed=s, num_groups=8, group_size=8
      )
      for s in SEEDS
  ]
  imp = np.concatenate([r.improvements for r in runs])
  allowed = stats.binom.ppf(0.999, imp.size, 0.05)
  assert np.sum(imp < 0) <= allowed
  assert runs[0].returns[-1] > runs[0].returns[0]  # it does learn
  for run in runs:
    # Stage bound <= exact stage improvement, in every stage ...
    assert np.all(run.bounds["episodic"] <= run.improvements)
    for record, js in zip(run.records, run.step_returns):
      step_lb = record.certificate["step_lower_bound"]
      # ... and every step's bound <= that step's exact improvement.
      assert np.all(np.asarray(step_lb) <= np.diff(js))
    # The monitor's delta_hat covers the exact sup-KL of accepted steps.
    for record, sup in zip(run.records, run.sup_kl):
      for step, kl in zip(record.steps, sup):
        slack = np.sqrt(
            np.log(2 / cfg.certificate.dkw_eta) / (2 * step["num_own_episodes"])
        )
        assert kl <= step["kl_quantile"] + slack
        assert step["accepted"] or kl == 0.0


def test_joint_updates_lower_J_while_sat_improves():
  out = toy_teams.joint_vs_sat(seeds=(0, 1), stages=4)
  joint = np.asarray(out["joint"]["mean_J_per_stage"])
  resample = np.asarray(out["sat_resample"]["mean_J_per_stage"])
  assert np.min(np.diff(joint)) < 0 and out["joint"]["decrease_rate"] > 0
  assert out["sat_resample"]["decrease_rate"] == 0.0
  assert resample[-1] > joint[-1]


def test_reuse_matches_resample_within_truncation_bias():
  game = toy.climbing_game()
  rng = np.random.default_rng(0)
  logits = [0.5 * rng.normal(size=(1, 3)), 0.5 * rng.normal(size=(1, 3))]
  rows = [
      exact.reuse_vs_resample(game, logits, d, group_size=3)
      for d in (0.03, 0.01, 0.003)
  ]
  gaps = [abs(r["gap"]) for r in rows]
  for r in rows:
    assert abs(r["gap"]) <= r["truncation_bias"]
  assert gaps[0] > gaps[1] > gaps[2]


def test_kl_step_hits_delta_and_rejects_unreachable_targets():
  logits = np.log([0.9, 0.1])
  # Reachable: two actions, so the step is t = logit(q) - logit(0.9) for the
  # q with KL((q, 1 - q) || (0.9, 0.1)) = 0.05, found here independently.
  q = optimize.brentq(
      lambda q: q * np.log(q / 0.9) + (1 - q) * np.log((1 - q) / 0.1) - 0.05,
      0.9,
      1 - 1e-12,
      xtol=1e-15,
  )
  t = np.log(q / (1 - q)) - np.log(9.0)
  np.testing.assert_allclose(
      exact.kl_step(logits, np.array([1.0, 0.0]), 0.05),
      logits + t * np.array([1.0, 0.0]),
      rtol=1e-10,
  )
  # Along (1, 0) the KL only tends to -log 0.9 = 0.1053605...: once this
  # returned logits + 743 * direction, with KL 0.105 instead of 0.2.
  with pytest.raises(
      ValueError, match=r"delta=0.2 is not reachable .* below 0.105361 "
  ):
    exact.kl_step(logits, np.array([1.0, 0.0]), 0.2)
  # A zero (or constant) direction reaches no KL at all: once NaN logits.
  for direction in ([0.0, 0.0], [3.0, 3.0]):
    with pytest.raises(ValueError, match=r"delta=0.01 .* below 0 "):
      exact.kl_step(logits, np.array(direction), 0.01)
  # ... which is where a stationary point puts reuse_vs_resample: uniform
  # play of the 2x2 coordination game has dJ = 0 (once all four were NaN).
  with pytest.raises(ValueError, match="delta=0.01 is not reachable"):
    exact.reuse_vs_resample(
        toy.coordination_game(2), [np.zeros((1, 2))] * 2, 0.01, 2
    )
  # A tiny direction still gets its step (t ~ 3e59) ...
  new = games.softmax(exact.kl_step(np.zeros(2), np.array([1e-60, 0.0]), 0.01))
  assert np.sum(new * np.log(2 * new)) == pytest.approx(0.01, rel=1e-9)
  # ... but one that needs t beyond 2**1023 stops there, where the doubling
  # once ran t to inf and returned NaN.
  with pytest.raises(
      ValueError, match=r"not reached .* by step t = 8.98847e\+307"
  ):
    exact.kl_step(np.zeros(2), np.array([1e-310, 0.0]), 0.01)
  with pytest.raises(ValueError, match="delta must be a finite KL > 0"):
    exact.kl_step(logits, np.array([1.0, 0.0]), -0.1)


def test_joint_table_header_counts_the_seeds_it_ran():
  joint = {"mean_J_per_stage": [0.5], "decrease_rate": 0.0, "min_J": 0.5}
  res = {
      "quick": True,
      "seeds": [0, 1],
      "stages": 4,
      "wall_seconds": 0.0,
      "monotonic_and_certificate": {},
      "certificate_vs_batch": [],
      "joint_vs_sat": {
          "setting": "s",
          "joint": joint,
          "sat_reuse": joint,
          "sat_resample": joint,
      },
      "reuse_vs_resample": [],
      "orders": {},
      "violation_sweep": {},
  }
  headers = [
      line
      for line in toy_teams.render_markdown(res).splitlines()
      if line.startswith("| method |")
  ]
  # --quick runs two seeds; the header once said 5 whatever ran.
  assert headers == [
      "| method | mean J per stage (2 seeds) | P(dJ < 0) | min J |"
  ]


def test_orders_reach_the_same_final_J():
  for make in (toy.climbing_game, toy.sequential_climbing_game):
    game = make()
    tol = toy_teams.ORDER_TOL * (game.reward_bounds[1] - game.reward_bounds[0])
    finals = {}
    for order in ("static", "reverse", "random"):
      cfg = toy_teams.small_delta_config(game, order=order)
      finals[order] = np.mean([
          toy.run_toy(
              game, cfg, num_stages=STAGES, seed=s, num_groups=8, group_size=8
          ).returns[-1]
          for s in SEEDS
      ])
    assert max(abs(v - finals["static"]) for v in finals.values()) <= tol


def test_a_game_of_your_own_in_a_few_lines():
  game = toy.matrix_game([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
  cfg = toy_teams.small_delta_config(game, delta=0.05)
  run = toy.run_toy(
      game, cfg, num_stages=20, seed=0, num_groups=8, group_size=8
  )
  assert run.returns[0] == pytest.approx(1 / 3)  # uniform: (1 + 2) / 9
  assert run.returns[-1] > 1.5  # toward the optimum 2


@pytest.mark.slow
def test_full_results_script(tmp_path):
  res = toy_teams.main(["--out", str(tmp_path)])
  for name, row in res["monotonic_and_certificate"].items():
    assert row["stages"] >= 1000, name
    assert row["monotone_rate"] >= 0.95, name
    assert row["cert_valid_rate"] == 1.0, name
  for name, row in res["orders"].items():
    assert row["within_tolerance"], name
  assert res["joint_vs_sat"]["sat_resample"]["decrease_rate"] == 0.0
  assert (tmp_path / "toy_teams.md").is_file()
