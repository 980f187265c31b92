"""The multi-process helpers on one process (two processes: train_sharded_test).

`initialize` is exercised through its environment parsing only: the real
connection needs several processes (see
train_sharded_test.test_two_process_run_resumes_and_matches_one_device).
"""

import jax
import numpy as np
import pytest

from sat_jax import multihost
from sat_jax import sharding


@pytest.mark.parametrize("environ", [{}, {"SAT_JAX_DISTRIBUTED": "0"}])
def test_initialize_is_off_unless_asked(environ):
  assert multihost.initialize(environ) is False


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"SAT_JAX_DISTRIBUTED": "yes"}, "SAT_JAX_DISTRIBUTED='yes'"),
        (
            {"SAT_JAX_DISTRIBUTED": "1", "JAX_NUM_PROCESSES": "two"},
            "JAX_NUM_PROCESSES='two' is not an integer",
        ),
        (
            {"SAT_JAX_DISTRIBUTED": "1", "JAX_NUM_PROCESSES": "0"},
            "JAX_NUM_PROCESSES=0 must be >= 1",
        ),
        (
            {
                "SAT_JAX_DISTRIBUTED": "1",
                "JAX_NUM_PROCESSES": "2",
                "JAX_PROCESS_ID": "2",
            },
            r"JAX_PROCESS_ID=2 is outside \[0, JAX_NUM_PROCESSES=2\)",
        ),
    ],
)
def test_initialize_names_a_bad_variable(environ, message):
  with pytest.raises(ValueError, match=message):
    multihost.initialize(environ)


def test_one_process_is_primary_and_its_barrier_returns():
  assert multihost.is_primary()
  multihost.barrier("test")  # one process: nothing to wait for


def test_to_host_reads_sharded_and_replicated_arrays():
  mesh = sharding.make_mesh(
      sharding.MeshConfig(axes=tuple(zip(sharding.MESH_AXES, (2, 2, 2))))
  )
  x = np.arange(32, dtype=np.float32).reshape(8, 4)
  spread = jax.device_put(
      x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  )
  out = multihost.to_host({"a": spread, "b": jax.numpy.ones(3), "c": 5})
  assert isinstance(out["a"], np.ndarray) and isinstance(out["b"], np.ndarray)
  np.testing.assert_array_equal(out["a"], x)
  np.testing.assert_array_equal(out["b"], np.ones(3))
  assert out["c"] == 5


def test_put_replicated_follows_the_current_mesh():
  alone = multihost.put_replicated(np.float32(2.5))
  assert len(alone.sharding.device_set) == 1
  mesh = sharding.make_mesh(
      sharding.MeshConfig(axes=tuple(zip(sharding.MESH_AXES, (2, 4, 1))))
  )
  with jax.set_mesh(mesh):
    on_mesh = multihost.put_replicated(np.float32(2.5))
  assert on_mesh.sharding.device_set == set(mesh.devices.flat)
  assert on_mesh.sharding.is_fully_replicated
  assert float(on_mesh) == 2.5
