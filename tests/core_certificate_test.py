"""The certificate's constants and terms, against hand computations."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax.core import certificate
from sat_jax.core import config as C


def test_kappa_is_the_ratio_cap_constant():
  r = np.linspace(2.0001, 200.0, 2_000_000)
  phi = r * np.log(r) - r + 1
  assert certificate.KAPPA == pytest.approx(1 / np.min(phi / (r - 2)), rel=1e-6)
  # The inequality it is used for: (r - 2)_+ <= kappa * (r log r - r + 1).
  grid = np.linspace(1e-6, 1e3, 100_000)
  lhs = np.maximum(grid - 2, 0)
  rhs = certificate.KAPPA * (grid * np.log(grid) - grid + 1)
  assert np.all(lhs <= rhs + 1e-12)


def test_step_statistics_by_hand():
  # Rewards in [0, 1] -> baseline 1/2, A = R - 1/2.
  u = np.log([1.1, 0.5, 3.0, 1.0])
  reward = np.array([1.0, 0.0, 0.0, 1.0])
  log_rho = np.log([2.0, 1.0, 0.5, 0.25])
  out = certificate.step_statistics(
      jnp.asarray(u, jnp.float32),
      jnp.asarray(reward, jnp.float32),
      jnp.asarray(log_rho, jnp.float32),
      baseline=0.5,
      epsilon=0.2,
      epsilon_high=0.2,
  )
  # Z~ per episode (r capped at 2, clip [0.8, 1.2]):
  #  r=1.1, A=+.5: min(.55, .55) - .5 = .05
  #  r=0.5, A=-.5: min(-.25, -.4) + .5 = .1
  #  r=2 (capped from 3), A=-.5: min(-1, -.6) + .5 = -.5
  #  r=1, A=+.5: 0
  z = np.array([0.05, 0.1, -0.5, 0.0])
  c = np.array([1.0, 1.0, 0.5, 0.25])
  rho = np.array([2.0, 1.0, 0.5, 0.25])
  np.testing.assert_allclose(float(out["gain"]), np.mean(c * z), atol=1e-7)
  np.testing.assert_allclose(
      float(out["bias"]), np.mean((rho - c) * np.abs(z)), atol=1e-7
  )
  assert float(out["capped_fraction"]) == 0.25


STEP = dict(
    accepted=True,
    gain=0.3,
    bias=0.01,
    kl_quantile=0.02,
    num_states=200,
    num_own_episodes=50,
    max_episode_states=2,
    num_episodes=100,
)


def test_episodic_terms_by_hand():
  cfg = C.CertificateConfig(
      reward_bounds=(-1.0, 3.0), horizon=2, delta_conf=0.1, dkw_eta=0.2
  )
  out = certificate.stage_bound(
      [STEP, dict(STEP, accepted=False)], cfg, num_agents=2, eps_max=0.25
  )
  a_max = 2.0
  # DKW slack over the agent's 50 own episodes (not its 200 states).
  d = 0.02 + math.sqrt(math.log(2 / 0.2) / 100)
  shift = a_max * min(certificate.KAPPA * 2 * d, math.sqrt(2 * d / 2), 1.0)
  fs = 1.25 * a_max * math.sqrt(math.log(2 * 2 / 0.1) / 200)
  assert out["step_shift"] == [pytest.approx(shift), 0.0]
  assert out["finite_sample"] == pytest.approx(fs)
  assert out["lower_bound"] == pytest.approx(0.3 - shift - 0.01 - fs)
  assert out["step_lower_bound"][1] == 0.0  # a rejected step is the identity
  # A batch in which the agent acted at 5 states of one episode refutes
  # horizon = 2: the shift then uses H = 5 (an LM agent's tokens).
  out = certificate.stage_bound(
      [dict(STEP, max_episode_states=5)], cfg, num_agents=2, eps_max=0.25
  )
  shift5 = a_max * min(certificate.KAPPA * 5 * d, math.sqrt(5 * d / 2), 1.0)
  assert shift5 > shift and out["shift"] == pytest.approx(shift5)


def test_discounted_uses_the_paper_constants():
  cfg = C.CertificateConfig(
      variant="discounted", reward_bounds=(0.0, 1.0), gamma=0.99
  )
  out = certificate.stage_bound([STEP], cfg, num_agents=3, eps_max=0.2)
  d = 0.02 + math.sqrt(math.log(2 / 0.05) / 100)
  assert out["shift"] == pytest.approx(
      2 * 0.99 / 0.01**2 * 0.5 * math.sqrt(d / 2)
  )
  assert out["bias"] == pytest.approx(0.01 / 0.01)
  assert out["finite_sample"] == pytest.approx(
      0.5 / 0.01 * math.sqrt(math.log(6 / 0.05) / 200)
  )
  assert out["lower_bound"] < -1000  # vacuous at gamma = 0.99, as stated


def test_variant_override_and_unknown_variant():
  cfg = C.CertificateConfig()
  assert (
      certificate.stage_bound([STEP], cfg, 1, 0.2, variant="discounted")[
          "variant"
      ]
      == "discounted"
  )
  with pytest.raises(ValueError, match="not one of"):
    certificate.stage_bound([STEP], cfg, 1, 0.2, variant="pac")
