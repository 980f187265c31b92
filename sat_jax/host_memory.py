"""Host memory: let XLA CPU reuse freed pages instead of faulting in new ones.

XLA on CPU allocates every call's temporaries (activations, scan residuals,
gradients) with malloc from its worker threads, and frees them when the call
ends. glibc serves each worker thread from its own arena, whose heaps are
capped at 64 MiB, so buffers of tens of MiB are mmap'ed fresh and unmapped
again on free: every call then page-faults its whole working set back in,
zero-filled by the kernel. On the bench-tiny GRPO update (32 x 80 tokens)
that is about 94,000 minor faults and 0.2 s of system CPU per call (of
~0.45 s wall on 2 cores); with the pages reused the call is 1.21x faster.

`reuse_freed_pages` makes every thread allocate from the main heap (one
arena), serves allocations below `mmap_threshold` from it, and keeps up to
`trim_threshold` bytes of freed memory in the process instead of returning
them to the kernel. Later calls then reuse the same, already-mapped pages.
The price is a higher resident size: freed memory stays mapped (the
bench-tiny gradient's peak RSS rose from 0.9 to 1.2-1.8 GiB). The setting
is for XLA on CPU; launch/run.sh turns it off on accelerator hosts.

It must run before the JAX backend starts its threads (before the first
computation; importing jax is fine): the arena setting applies to threads
created afterwards. The `sat-jax` command line calls it first thing; set
SAT_JAX_MALLOC=system to keep glibc's defaults. Measured in
BENCHMARKS.md ("Host memory"); tests/host_memory_test.py checks
the fault counts in fresh processes.
"""

import ctypes
import functools
import logging
import os

_INT_MAX = 2**31 - 1  # mallopt takes a C int
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = _INT_MAX

ENV_VAR = "SAT_JAX_MALLOC"

log = logging.getLogger(__name__)


@functools.cache
def _glibc():
  """The process's C library if it is glibc (has mallopt), else None.

  The already-loaded library's symbols (`CDLL(None)`), not a lookup by
  name: `ctypes.util.find_library` runs a subprocess, and a fork leaves
  every page of the heap copy-on-write, i.e. faulting again on its next
  write, which is what this module is there to avoid.
  """
  try:
    libc = ctypes.CDLL(None)
  except OSError:
    return None
  if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
    return None
  return libc


# (mallopt parameter from <malloc.h>, environment variable, value).
_ONE_ARENA = (-8, "MALLOC_ARENA_MAX", 1)  # M_ARENA_MAX


def _thresholds(mmap_threshold, trim_threshold):
  for name, value in (
      ("mmap_threshold", mmap_threshold),
      ("trim_threshold", trim_threshold),
  ):
    if not isinstance(value, int) or not 0 <= value <= _INT_MAX:
      raise ValueError(f"{name}={value!r} is not an int in [0, 2**31 - 1]")
  return (
      (-3, "MALLOC_MMAP_THRESHOLD_", mmap_threshold),  # M_MMAP_THRESHOLD
      (-1, "MALLOC_TRIM_THRESHOLD_", trim_threshold),  # M_TRIM_THRESHOLD
  )


@functools.cache
def _set_one_arena(libc) -> bool:
  # Once per process: set again once XLA's threads run, M_ARENA_MAX undoes
  # the reuse (measured: 0 -> ~74,000 faults per bench-tiny gradient call).
  param, _, value = _ONE_ARENA
  return libc.mallopt(param, value) == 1


def glibc_environment(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> dict[str, str]:
  """The same settings as glibc environment variables, for a child process.

  glibc reads them when the process starts, so they also reach programs
  that cannot call `reuse_freed_pages` (a PyTorch baseline in a benchmark).
  """
  settings = (_ONE_ARENA,) + _thresholds(mmap_threshold, trim_threshold)
  return {env: str(value) for _, env, value in settings}


def reuse_freed_pages(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> bool:
  """Tunes glibc malloc as the module docstring says; True if it applied.

  Returns False (and changes nothing) on a C library other than glibc, or
  when $SAT_JAX_MALLOC is "system". Call it before the first JAX
  computation. A later call changes only the two thresholds (the one-arena
  setting is made once per process). Raises ValueError for a threshold
  outside [0, 2**31 - 1].
  """
  thresholds = _thresholds(mmap_threshold, trim_threshold)
  setting = os.environ.get(ENV_VAR, "reuse")
  if setting not in ("reuse", "system"):
    raise ValueError(f"${ENV_VAR}={setting!r}: expected 'reuse' or 'system'")
  if setting == "system":
    return False
  libc = _glibc()
  if libc is None:
    log.info("not glibc: host malloc left at its defaults")
    return False
  oks = [_set_one_arena(libc)]
  oks += [libc.mallopt(param, value) == 1 for param, _, value in thresholds]
  if not all(oks):
    log.warning("glibc refused a mallopt setting; malloc partly tuned")
  return all(oks)
