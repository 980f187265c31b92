"""Per-phase wall times of `sat_jax.core.stage.run_stage`, measured from outside.

`PhaseTimer.installed()` wraps, for the duration of a `with` block, the
module attributes that the stage loop calls at run time (nothing in sat_jax
is edited):

  rollout     the RolloutFn (the caller wraps it with `timer.rollout(fn)`)
  update      `objective.update_agent`, the first try of each agent step
              (its epochs x minibatches of optax steps plus the in-jit KL
              monitor and surrogate recompute that decide acceptance)
  backtracks  `objective.update_agent` again from the same kept params
              (a retry after a violated trust region)
  scoring     `objective.sequence_logratio` (u_j after each accepted step)
              and `objective.surrogate_grad_norm` (the greedy order)

Each wrapper blocks on its outputs. That adds no stall of note: the
stage loop reads one scalar of every try right away (the acceptance) and
the rollout pulls its samples to the host. `stage_s` is the wall time of
the whole `run_stage` call; `other_s` = stage - the phases above (the
advantages, the certificate statistics, batch checks, host work).
"""

import collections
import contextlib
import time
from typing import Any, Callable

import jax

from sat_jax.core import objective

PHASES = ("rollout", "update", "backtracks", "scoring")


class PhaseTimer:
  """Accumulates phase seconds and counts; `take()` returns and resets."""

  def __init__(self):
    self._seconds = collections.defaultdict(float)
    self._counts = collections.defaultdict(int)
    self._last_params = None  # params of the previous update try

  def _add(self, phase: str, seconds: float) -> None:
    self._seconds[phase] += seconds
    self._counts[phase] += 1

  def _timed(self, phase_of: Callable[..., str], fn: Callable[..., Any]):
    def wrapper(*args, **kwargs):
      phase = phase_of(*args, **kwargs)
      t0 = time.perf_counter()
      out = jax.block_until_ready(fn(*args, **kwargs))
      self._add(phase, time.perf_counter() - t0)
      return out

    return wrapper

  def rollout(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` timed as the rollout phase (a new rollout ends a retry chain)."""

    def phase(*args, **kwargs):
      del args, kwargs
      self._last_params = None
      return "rollout"

    return self._timed(phase, fn)

  def _update_phase(self, agent, cfg, params, *args, **kwargs) -> str:
    del agent, cfg, args, kwargs
    # trust_region retries from the very same kept params object.
    retry = params is self._last_params
    self._last_params = params
    return "backtracks" if retry else "update"

  @contextlib.contextmanager
  def installed(self):
    """Wraps the stage loop's jitted phases while the block runs."""
    originals = {
        name: getattr(objective, name)
        for name in ("update_agent", "sequence_logratio", "surrogate_grad_norm")
    }
    objective.update_agent = self._timed(
        self._update_phase, originals["update_agent"]
    )
    for name in ("sequence_logratio", "surrogate_grad_norm"):
      setattr(
          objective,
          name,
          self._timed(lambda *a, **k: "scoring", originals[name]),
      )
    try:
      yield self
    finally:
      for name, fn in originals.items():
        setattr(objective, name, fn)
      self._last_params = None

  def take(self, stage_s: float | None = None) -> dict[str, float]:
    """Seconds and counts per phase since the last take (then reset)."""
    out = {f"{p}_s": self._seconds.get(p, 0.0) for p in PHASES}
    out.update({f"{p}_calls": self._counts.get(p, 0) for p in PHASES})
    if stage_s is not None:
      out["stage_s"] = stage_s
      out["other_s"] = stage_s - sum(out[f"{p}_s"] for p in PHASES)
    self._seconds.clear()
    self._counts.clear()
    return out


def timed_stage(run_stage, timer: PhaseTimer, *args, **kwargs):
  """(new team, record, phase dict) of one `run_stage` call, all synced."""
  t0 = time.perf_counter()
  team, record = run_stage(*args, **kwargs)
  jax.block_until_ready(team)
  return team, record, timer.take(time.perf_counter() - t0)
