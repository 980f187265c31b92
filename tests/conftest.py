"""Test session set-up: 8 fake CPU devices and strict JAX, before JAX loads."""

import os

# Must happen before the first `import jax` anywhere in the session.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pathlib  # pylint: disable=g-import-not-at-top

from sat_jax import host_memory  # pylint: disable=g-import-not-at-top

# As the `sat-jax` command does: XLA CPU reuses freed pages (host_memory).
host_memory.reuse_freed_pages()


import jax  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

jax.config.update("jax_numpy_rank_promotion", "raise")
jax.config.update("jax_threefry_partitionable", True)

_REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_benchmarks() -> pathlib.Path:
  """The real benchmark folder; tests that need it skip when it is absent.

  Looked up in $SAT_JAX_BENCHMARKS, then ../shared/benchmarks next to the repo.
  """
  env = os.environ.get("SAT_JAX_BENCHMARKS")
  path = pathlib.Path(env) if env else _REPO.parent / "shared" / "benchmarks"
  if not path.is_dir():
    pytest.skip(f"benchmark data not found at {path}")
  return path
