"""Tests of avg@K, unbiased pass@k and maj@K against enumeration and by hand."""

import fractions
import itertools
import math

import pytest

from sat_jax.eval import metrics


def _brute_force_pass(n, c, k):
  """Fraction of all k-subsets of n samples (c correct) with a correct one."""
  subsets = list(itertools.combinations(range(n), k))
  return fractions.Fraction(sum(min(s) < c for s in subsets), len(subsets))


def test_pass_at_k_equals_enumeration_of_all_subsets():
  for n in range(1, 9):
    for c in range(n + 1):
      for k in range(1, n + 1):
        want = float(_brute_force_pass(n, c, k))
        assert metrics.pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12), (
            n,
            c,
            k,
        )


def test_pass_at_k_is_stable_for_large_n():
  for n, c, k in [
      (200, 3, 10),
      (1000, 1, 1),
      (10_000, 9_000, 900),
      (10_000, 10, 5_000),
      (64, 0, 64),
      (64, 1, 64),
  ]:
    exact = 1 - fractions.Fraction(math.comb(n - c, k), math.comb(n, k))
    assert metrics.pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
  assert metrics.pass_at_k(1000, 1, 1) == pytest.approx(0.001)


def test_pass_at_k_bad_arguments():
  for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
    with pytest.raises(ValueError):
      metrics.pass_at_k(n, c, k)


def test_avg_and_mean_pass_by_hand():
  correct = [[True, False, False, False], [True, True, False, False]]
  assert metrics.avg_at_k(correct) == pytest.approx((1 / 4 + 2 / 4) / 2)
  # pass@2: 1 - C(3,2)/C(4,2) = 1/2 and 1 - C(2,2)/C(4,2) = 5/6.
  assert metrics.mean_pass_at_k([4, 4], [1, 2], 2) == pytest.approx(
      (1 / 2 + 5 / 6) / 2
  )
  with pytest.raises(ValueError):
    metrics.avg_at_k([[True], []])


def test_majority_by_hand():
  mc = metrics.majority_correct
  assert not mc(["a", "b", "b", None], [True, False, False, False])
  assert mc(["a", "b"], [True, False])  # tie: the earliest sample
  assert not mc(["b", "a"], [False, True])
  assert mc([None, "x", "y", "x"], [False, True, False, True])
  assert mc([None, None, "y"], [False, False, True])  # no-answers do not vote
  assert not mc([None, None], [False, False])
  assert metrics.maj_at_k(
      [["a", "a", "b"], ["c", "d", "d"]],
      [[True, True, False], [True, False, False]],
  ) == pytest.approx(0.5)
  with pytest.raises(ValueError):
    mc(["a"], [True, False])


def test_default_pass_ks():
  assert metrics.default_pass_ks(64) == [1, 2, 4, 8, 16, 32, 64]
  assert metrics.default_pass_ks(25) == [1, 2, 4, 8, 16, 25]
  assert metrics.default_pass_ks(4) == [1, 2, 4]
  assert metrics.default_pass_ks(1) == [1]
