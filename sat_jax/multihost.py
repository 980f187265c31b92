"""What a run does differently when it spans several JAX processes.

On a TPU pod or a multi-node GPU job every process runs the same program
over its own devices (`jax.distributed`). Two things then need care, and this
module owns both:

- Files. The run directory is shared (GCS, NFS): process 0 alone writes run
  files (metrics, samples, evaluations, plots, the summary, the warm start's
  base); the others wait at a barrier where they then read what it wrote.
  Checkpoints are the exception: orbax coordinates them, every process calls
  save and restore.
- Host reads. An array whose shards live on other processes' devices cannot
  be read with `np.asarray` / `jax.device_get`; `to_host` gathers it first.

With one process every function here is the single-host behaviour (no
barrier, no gather), so library code calls them unconditionally.
"""

import os
from typing import Any, Mapping

import jax
from jax.experimental import multihost_utils
import numpy as np

PyTree = Any
ENV_FLAG = "SAT_JAX_DISTRIBUTED"


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
  if name not in environ:
    return None
  try:
    return int(environ[name])
  except ValueError:
    raise ValueError(f"{name}={environ[name]!r} is not an integer") from None


def initialize(environ: Mapping[str, str] | None = None) -> bool:
  """Connects this process to the others when `SAT_JAX_DISTRIBUTED=1`.

  Call it before any device is touched. Where the cluster is not detected
  by JAX itself (Cloud TPU, Slurm, MPI, Kubernetes), the coordinates come
  from JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES
  and JAX_PROCESS_ID. CPU processes exchange data through gloo (accelerator
  backends keep their own collectives). Returns whether it connected.
  """
  environ = os.environ if environ is None else environ
  flag = environ.get(ENV_FLAG, "")
  if flag in ("", "0"):
    return False
  if flag != "1":
    raise ValueError(f"{ENV_FLAG}={flag!r}: expected 1 (on) or 0 (off)")
  kwargs = {}
  num_processes = _env_int(environ, "JAX_NUM_PROCESSES")
  process_id = _env_int(environ, "JAX_PROCESS_ID")
  if num_processes is not None:
    if num_processes < 1:
      raise ValueError(f"JAX_NUM_PROCESSES={num_processes} must be >= 1")
    kwargs["num_processes"] = num_processes
  if process_id is not None:
    if num_processes is not None and not 0 <= process_id < num_processes:
      raise ValueError(
          f"JAX_PROCESS_ID={process_id} is outside [0, JAX_NUM_PROCESSES="
          f"{num_processes})"
      )
    kwargs["process_id"] = process_id
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**kwargs)
  return True


def is_primary() -> bool:
  """True in the process that writes run files (process 0)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Blocks until every process reaches the barrier `name` (no-op alone).

  Every process must call it with the same names in the same order.
  """
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def primary_decides(flag: bool) -> bool:
  """Process 0's `flag` in every process (a collective with several).

  For host-side decisions that change which collectives run next, such as
  stopping on a wall-clock budget: each process's own clock could decide
  differently and leave the others waiting.
  """
  if jax.process_count() == 1:
    return bool(flag)
  return bool(multihost_utils.broadcast_one_to_all(np.bool_(flag)))


def to_host(tree: PyTree) -> PyTree:
  """numpy copies of every array of `tree`, gathered from all processes.

  `jax.device_get` (one batched transfer) for arrays this process can read
  whole: every array with one process, and replicated ones. An array with
  shards on other processes' devices is gathered to its full global value
  on every process first (`process_allgather`, a collective: every process
  must call this with the same tree). Non-array leaves pass through.
  """

  def gather(x):
    if isinstance(x, jax.Array) and not (
        x.is_fully_addressable or x.is_fully_replicated
    ):
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return x

  return jax.device_get(jax.tree.map(gather, tree))


def put_replicated(tree: PyTree) -> PyTree:
  """Host values as device arrays, replicated over the current mesh.

  Outside a mesh (`jax.set_mesh`) this is `jax.device_put` to the default
  device. Under one, every device of the mesh holds a copy: on several
  processes an array on one local device cannot meet the mesh's arrays in
  a jitted call, nor be saved by orbax.
  """
  mesh = jax.sharding.get_mesh()
  if mesh.empty:
    return jax.device_put(tree)
  where = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.device_put(tree, where)
