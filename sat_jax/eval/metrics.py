"""Sample-based evaluation metrics: avg@K, unbiased pass@k, maj@K.

Per problem i there are n_i scored samples, c_i of them correct.
- avg@K = mean_i (c_i / n_i): pass@1 averaged over the K samples.
- pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on
  Code"): the probability that at least one of k samples drawn without
  replacement from the n_i is correct, 1 - C(n_i - c_i, k) / C(n_i, k),
  averaged over problems.
- maj@K: the answer most samples agree on (by vote key; samples without an
  answer do not vote; ties go to the earliest sample) is correct.
"""

from typing import Hashable, Sequence

import numpy as np

from sat_jax.tasks import base


def pass_at_k(n: int, c: int, k: int) -> float:
  """1 - C(n-c, k) / C(n, k), as the stable product 1 - prod (1 - k / j).

  The product runs over j = n-c+1 .. n; it equals 1 when n - c < k.
  """
  if not 0 <= c <= n:
    raise ValueError(f"pass_at_k needs 0 <= c <= n, got n={n}, c={c}")
  if not 1 <= k <= n:
    raise ValueError(f"pass_at_k needs 1 <= k <= n, got k={k}, n={n}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(
    n_per_problem: Sequence[int], c_per_problem: Sequence[int], k: int
) -> float:
  """pass@k averaged over problems."""
  if len(n_per_problem) != len(c_per_problem) or not n_per_problem:
    raise ValueError("mean_pass_at_k needs equal, non-empty n and c lists")
  return float(
      np.mean(
          [pass_at_k(n, c, k) for n, c in zip(n_per_problem, c_per_problem)]
      )
  )


def avg_at_k(correct_per_problem: Sequence[Sequence[bool]]) -> float:
  """mean over problems of the fraction of correct samples."""
  if not correct_per_problem or any(not c for c in correct_per_problem):
    raise ValueError("avg_at_k needs at least one sample per problem")
  return float(np.mean([np.mean(c) for c in correct_per_problem]))


def majority_correct(
    keys: Sequence[Hashable | None], correct: Sequence[bool]
) -> bool:
  """Whether the majority-voted answer of one problem is correct.

  `keys[j]` is sample j's vote key (None: no answer, no vote). The voted
  sample is the earliest one with the most frequent key; with no votes at all
  the problem is wrong.
  """
  if len(keys) != len(correct):
    raise ValueError(f"{len(keys)} keys but {len(correct)} correctness flags")
  voters = [j for j, key in enumerate(keys) if key is not None]
  if not voters:
    return False
  winner = voters[base.majority([keys[j] for j in voters])]
  return bool(correct[winner])


def maj_at_k(
    keys_per_problem: Sequence[Sequence[Hashable | None]],
    correct_per_problem: Sequence[Sequence[bool]],
) -> float:
  """Fraction of problems whose majority-voted answer is correct."""
  if len(keys_per_problem) != len(correct_per_problem) or not keys_per_problem:
    raise ValueError("maj_at_k needs equal, non-empty key and flag lists")
  return float(
      np.mean([
          majority_correct(k, c)
          for k, c in zip(keys_per_problem, correct_per_problem)
      ])
  )


def default_pass_ks(k: int) -> list[int]:
  """1, 2, 4, ... below k, then k itself: the pass@k curve to report."""
  ks = [1]
  while ks[-1] * 2 < k:
    ks.append(ks[-1] * 2)
  if ks[-1] != k:
    ks.append(k)
  return ks
