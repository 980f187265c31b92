"""Group advantages with truncated weights, against hand-computed values."""

import math
import re

import jax.numpy as jnp
import numpy as np

from sat_jax.core import advantage
from sat_jax.core import tracing

EPS = 1e-6


def _adv(reward, group, log_rho, num_groups, a_clip=5.0):
  out = advantage.sequence_advantages(
      jnp.asarray(reward, jnp.float32),
      jnp.asarray(group, jnp.int32),
      jnp.asarray(log_rho, jnp.float32),
      num_groups=num_groups,
      a_clip=a_clip,
      std_eps=EPS,
  )
  return np.asarray(out.adv_E), np.asarray(out.c_E)


def test_plain_group_z_score():
  # Group 0: mean 1/2, std 1/2. Group 1: mean 5/2, std 3/2 (population).
  adv, c = _adv([1, 0, 0, 1, 2, 2, 5, 1], [0] * 4 + [1] * 4, np.zeros(8), 2)
  np.testing.assert_allclose(c, 1.0)
  expected = [0.5 / (0.5 + EPS)] * 4 * np.array([1, -1, -1, 1])
  np.testing.assert_allclose(adv[:4], expected, rtol=1e-6)
  np.testing.assert_allclose(
      adv[4:], np.array([-0.5, -0.5, 2.5, -1.5]) / (1.5 + EPS), rtol=1e-6
  )


def test_groups_need_not_be_contiguous():
  adv, _ = _adv(
      [1, 2, 0, 2, 0, 5, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1], np.zeros(8), 2
  )
  contiguous, _ = _adv(
      [1, 0, 0, 1, 2, 2, 5, 1], [0] * 4 + [1] * 4, np.zeros(8), 2
  )
  np.testing.assert_allclose(adv[[0, 2, 4, 6, 1, 3, 5, 7]], contiguous)


def test_truncated_weights_enter_the_group_statistics():
  # rho = (2, 1/2, 1, 1/4) -> c = (1, 1/2, 1, 1/4). By hand: mu = 5/11,
  # deviations (6, -5, -5, 6)/11, sigma^2 = 30/121.
  log_rho = np.log([2.0, 0.5, 1.0, 0.25])
  adv, c = _adv([1, 0, 0, 1], [0] * 4, log_rho, 1)
  np.testing.assert_allclose(c, [1, 0.5, 1, 0.25], rtol=1e-6)
  sigma = math.sqrt(30) / 11
  expected = np.array([6, -5, -5, 6]) / 11 / (sigma + EPS)
  np.testing.assert_allclose(adv, expected, rtol=1e-5)


def test_clip_and_degenerate_group():
  # Group 0: one outlier, z = sqrt(7) > A_clip = 2. Group 1: all equal -> 0.
  reward = [0] * 7 + [10] + [3] * 8
  adv, _ = _adv(reward, [0] * 8 + [1] * 8, np.zeros(16), 2, a_clip=2.0)
  assert adv[7] == 2.0
  np.testing.assert_allclose(
      adv[:7], -1.25 / (math.sqrt(87.5 / 8) + EPS), rtol=1e-6
  )
  assert np.all(adv[8:] == 0.0)


def test_traced_once_per_shape():
  tracing.reset_trace_counts()
  for seed in range(3):
    rng = np.random.default_rng(seed)
    _adv(rng.normal(size=12), np.arange(12) // 4, rng.normal(size=12), 3)
  assert tracing.trace_counts()["sequence_advantages"] == 1


def test_no_elementwise_op_is_left_unfused():
  hlo = advantage.compiled_hlo(num_episodes=512, num_groups=64)
  entry = hlo[hlo.index("ENTRY") :]
  elementwise = re.compile(
      r"\s(add|subtract|multiply|divide|exponential|clamp|select|maximum|"
      r"minimum|sqrt|compare|convert)\("
  )
  offenders = [line for line in entry.splitlines() if elementwise.search(line)]
  assert not offenders, offenders
  assert entry.count(" fusion(") >= 1
