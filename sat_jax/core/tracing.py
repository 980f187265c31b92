"""Trace counters: how often each jitted SAT phase has been traced.

A jitted function calls `count_trace(name)` in its Python body, which runs
only when JAX traces it (a cache miss). Tests read `trace_counts()` to assert
that a phase compiles once per agent architecture, across stages and across
same-shaped agents.
"""

import collections

_COUNTS: collections.Counter[str] = collections.Counter()


def count_trace(name: str) -> None:
  """Records one trace of the phase `name` (call from a jitted body)."""
  _COUNTS[name] += 1


def trace_counts() -> dict[str, int]:
  """Traces so far, per phase name."""
  return dict(_COUNTS)


def reset_trace_counts() -> None:
  _COUNTS.clear()
