"""Host memory: let XLA CPU reuse freed pages instead of faulting in new ones.

XLA on CPU allocates every call's temporaries (activations, scan residuals,
gradients) with malloc from its worker threads, and frees them when the call
ends. glibc serves each worker thread from its own arena, whose heaps are
capped at 64 MiB, so buffers of tens of MiB are mmap'ed fresh and unmapped
again on free: every call then page-faults its whole working set back in,
zero-filled by the kernel. On the bench-tiny GRPO update (32 x 80 tokens)
that is about 94,000 minor faults and 0.2 s of system CPU per call (of
~0.45 s wall on 2 cores); with the pages reused the call is 1.27x faster.

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
import ctypes.util
import logging
import os

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_INT_MAX = 2**31 - 1  # mallopt takes a C int

ENV_VAR = "SAT_JAX_MALLOC"

log = logging.getLogger(__name__)


def _glibc():
  """The C library if it is glibc (has mallopt and gnu_get_libc_version)."""
  name = ctypes.util.find_library("c")
  if name is None:
    return None
  try:
    libc = ctypes.CDLL(name)
  except OSError:
    return None
  if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
    return None
  return libc


def _check_thresholds(mmap_threshold, trim_threshold) -> None:
  for name, value in (
      ("mmap_threshold", mmap_threshold),
      ("trim_threshold", trim_threshold),
  ):
    if not isinstance(value, int) or not 0 <= value <= _INT_MAX:
      raise ValueError(f"{name}={value!r} is not an int in [0, 2**31 - 1]")


def glibc_environment(
    mmap_threshold: int = 1 << 30, trim_threshold: int = _INT_MAX
) -> dict[str, str]:
  """The same settings as glibc environment variables, for a child process.

  glibc reads them when the process starts, so they also reach programs
  that cannot call `reuse_freed_pages` (a PyTorch baseline in a benchmark).
  """
  _check_thresholds(mmap_threshold, trim_threshold)
  return {
      "MALLOC_ARENA_MAX": "1",
      "MALLOC_MMAP_THRESHOLD_": str(mmap_threshold),
      "MALLOC_TRIM_THRESHOLD_": str(trim_threshold),
  }


def reuse_freed_pages(
    mmap_threshold: int = 1 << 30, trim_threshold: int = _INT_MAX
) -> bool:
  """Tunes glibc malloc as the module docstring says; True if it applied.

  Returns False (and changes nothing) on a C library other than glibc, or
  when $SAT_JAX_MALLOC is "system". Call it before the first JAX
  computation. Raises ValueError for a threshold outside [0, 2**31 - 1].
  """
  _check_thresholds(mmap_threshold, trim_threshold)
  setting = os.environ.get(ENV_VAR, "reuse")
  if setting not in ("reuse", "system"):
    raise ValueError(f"${ENV_VAR}={setting!r}: expected 'reuse' or 'system'")
  if setting == "system":
    return False
  libc = _glibc()
  if libc is None:
    log.info("not glibc: host malloc left at its defaults")
    return False
  ok = all(
      libc.mallopt(param, value) == 1
      for param, value in (
          (_M_ARENA_MAX, 1),
          (_M_MMAP_THRESHOLD, mmap_threshold),
          (_M_TRIM_THRESHOLD, trim_threshold),
      )
  )
  if not ok:
    log.warning("glibc refused a mallopt setting; malloc partly tuned")
  return ok
