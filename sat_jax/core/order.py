"""ORDERAGENTS: the update order sigma of one stage, chosen by name.

  static   0, 1, ..., n-1
  reverse  n-1, ..., 0
  random   a permutation drawn from the stage key (seeded, reproducible)
  greedy   agents sorted by a measured predicted gain, largest first. The
           measure (computed by the stage loop) is ||grad_theta_j L_j||, the
           norm of agent j's surrogate gradient at the stage-start params on
           the stage batch (c = 1): a first-order step of size eta gains
           about eta * ||grad||^2. Ties keep the lower index first.
  (a tuple) an explicit permutation, checked.

There is no fallback: greedy without gains, or a non-permutation, raises.
"""

from typing import Callable, Sequence

import jax
import numpy as np

from sat_jax import multihost
from sat_jax.core import config as config_lib


def _static(n, key, gains):
  del key, gains
  return tuple(range(n))


def _reverse(n, key, gains):
  del key, gains
  return tuple(reversed(range(n)))


_permutation = jax.jit(jax.random.permutation, static_argnums=1)


def _random(n, key, gains):
  del gains
  if key is None:
    raise ValueError("order='random' needs a PRNG key")
  return tuple(int(i) for i in multihost.to_host(_permutation(key, n)))


def _greedy(n, key, gains):
  del key
  if gains is None:
    raise ValueError("order='greedy' needs the predicted gain of every agent")
  gains = np.asarray(gains, np.float64)
  if gains.shape != (n,) or not np.isfinite(gains).all():
    raise ValueError(
        f"greedy: predicted gains {gains} are not {n} finite values"
    )
  return tuple(int(i) for i in np.argsort(-gains, kind="stable"))


ORDERS: dict[str, Callable[..., tuple[int, ...]]] = {
    "static": _static,
    "reverse": _reverse,
    "random": _random,
    "greedy": _greedy,
}
assert tuple(ORDERS) == config_lib.ORDERS


def order_agents(
    order: str | Sequence[int],
    num_agents: int,
    key: jax.Array | None = None,
    predicted_gain: Sequence[float] | None = None,
) -> tuple[int, ...]:
  """sigma for one stage; always a checked permutation of 0..n-1."""
  if isinstance(order, str):
    config_lib.check_choice("order", order, tuple(ORDERS))
    sigma = ORDERS[order](num_agents, key, predicted_gain)
  else:
    sigma = order
  return config_lib.check_permutation(sigma, num_agents)
