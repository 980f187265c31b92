"""Saves team checkpoints in a loop until killed (for checkpoint_test.py).

Usage: checkpoint_writer_script.py DIRECTORY NUM_STEPS

Resumes after the latest step in DIRECTORY and saves steps whose every value
is a function of (step, agent) (`team_state`), so a reader can check any
restored step exactly. After each step is on disk it prints "done <step>".
"""

import os
import sys

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import optax  # pylint: disable=g-import-not-at-top

NUM_AGENTS = 2
# Big enough (about 3 MB per agent with adam moments) that a kill at a random
# moment usually lands while arrays are being written.
ROWS, COLS = 256, 1024


def team_state(step: int, j: int, sharding=None) -> dict:
  """Agent j's state at `step`: params, adam state and scalars."""
  base = jnp.float32(step * 100 + j)
  w = base + jnp.arange(ROWS * COLS, dtype=jnp.float32).reshape(ROWS, COLS)
  if sharding is not None:
    w = jax.device_put(w, sharding)
  params = {"w": w, "b": jnp.full((COLS,), -base)}
  opt = optax.adamw(1e-3).init(params)
  opt = jax.tree.map(lambda x: x + (step % 7 + 1) * (j + 1), opt)
  return {"params": params, "opt": opt, "beta": base / 8, "delta": base / 16}


def team_meta(step: int, j: int) -> dict:
  return {"step": step, "agent": j, "name": f"agent-{j}"}


def team_cursor(step: int) -> dict:
  return {"stage": step, "order": [step % 2, 1 - step % 2], "next_agent": 0}


def main() -> None:
  from sat_jax import checkpoint  # pylint: disable=g-import-not-at-top

  directory, num_steps = sys.argv[1], int(sys.argv[2])
  mesh = jax.make_mesh(
      (2, 4), ("data", "fsdp"), axis_types=(jax.sharding.AxisType.Auto,) * 2
  )
  spec = jax.sharding.PartitionSpec("fsdp", None)
  sharding = jax.sharding.NamedSharding(mesh, spec)
  ckpt = checkpoint.TeamCheckpointer(directory, max_to_keep=2)
  start = (ckpt.latest_step() or 0) + 1
  for step in range(start, start + num_steps):
    states = [team_state(step, j, sharding) for j in range(NUM_AGENTS)]
    metas = [team_meta(step, j) for j in range(NUM_AGENTS)]
    ckpt.save(step, states, metas, team_cursor(step))
    ckpt.wait_until_finished()
    print(f"done {step}", flush=True)
  ckpt.close()


if __name__ == "__main__":
  main()
