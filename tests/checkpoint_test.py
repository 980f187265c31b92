"""Tests for sat_jax.checkpoint: round trips, resharding, swaps, kill -9."""

import importlib.util
import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import time

import flax
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from sat_jax import checkpoint

_HERE = pathlib.Path(__file__).resolve().parent
_WRITER = _HERE / "checkpoint_writer_script.py"


def _load_writer():
  spec = importlib.util.spec_from_file_location("ckpt_writer", _WRITER)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


writer = _load_writer()


@flax.struct.dataclass
class AgentState:
  params: dict
  opt_state: optax.OptState
  beta: jax.Array
  delta: jax.Array


def mesh_2d(shape):
  return jax.make_mesh(shape, ("x", "y"), axis_types=(AxisType.Auto,) * 2)


def make_agent(seed, rows, cols, tx, mesh=None, spec=P("y", "x")):
  key = jax.random.key(seed)
  w = jax.random.normal(key, (rows, cols))
  b = jnp.arange(cols, dtype=jnp.float32) + seed
  if mesh is not None:
    w = jax.device_put(w, NamedSharding(mesh, spec))
    b = jax.device_put(b, NamedSharding(mesh, P("x")))
  params = {"w": w, "b": b}
  opt_state = tx.init(params)
  # Make the optimizer moments non-trivial, as after a few updates.
  opt_state = jax.tree.map(lambda x: x + 3, opt_state)
  return AgentState(
      params, opt_state, jnp.float32(0.1 * seed), jnp.float32(2.0)
  )


def team_on(mesh, spec=P("y", "x")):
  return [
      make_agent(1, 8, 16, optax.adamw(1e-3), mesh, spec),
      make_agent(2, 16, 8, optax.sgd(1e-2, momentum=0.9), mesh, spec),
  ]


METAS = [{"name": "qwen", "size": 1}, {"name": "llama", "tags": ["a"]}]
CURSOR = {"stage": 3, "order": [1, 0], "next_agent": 1}


def targets_like(team, sharding_fn):
  """ShapeDtypeStruct targets with the sharding `sharding_fn(leaf)`."""
  return [
      jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(
              x.shape, x.dtype, sharding=sharding_fn(x)
          ),
          state,
      )
      for state in team
  ]


def assert_same(restored, expected, target=None):
  assert jax.tree.structure(restored) == jax.tree.structure(expected)
  for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  if target is not None:
    for got, t in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
      assert got.sharding.is_equivalent_to(t.sharding, got.ndim)


@pytest.fixture
def saved(tmp_path):
  """A team saved as step 5 from a 2x4 mesh."""
  team = team_on(mesh_2d((2, 4)))
  ckpt = checkpoint.TeamCheckpointer(tmp_path / "ckpt")
  ckpt.save(5, team, METAS, CURSOR)
  ckpt.wait_until_finished()
  yield ckpt, team
  ckpt.close()


def test_restore_onto_other_mesh_and_single_device_is_bit_exact(saved):
  ckpt, team = saved
  assert ckpt.all_steps() == [5] and ckpt.latest_step() == 5
  assert ckpt.num_agents(5) == 2
  other = mesh_2d((4, 2))
  for sharding_fn in (
      lambda x: NamedSharding(
          other, P(*[None] * (x.ndim - 1), "x") if x.ndim else P()
      ),
      lambda x: jax.sharding.SingleDeviceSharding(jax.devices()[3]),
  ):
    targets = targets_like(team, sharding_fn)
    states, metas, cursor = ckpt.restore(5, targets)
    for got, want, target in zip(states, team, targets):
      assert_same(got, want, target)
    assert isinstance(states[0], AgentState)
    assert isinstance(states[0].opt_state[0], optax.ScaleByAdamState)
    assert metas == tuple(METAS) and cursor == CURSOR


def test_restore_agent_alone(saved):
  ckpt, team = saved
  target = targets_like(team, lambda x: x.sharding)[1]
  state, meta = ckpt.restore_agent(5, 1, target)
  assert_same(state, team[1], target)
  assert meta == METAS[1]
  assert ckpt.restore_cursor(5) == CURSOR


@pytest.mark.parametrize("with_targets", [False, True])
def test_replace_agent_changes_only_that_slot(saved, with_targets):
  ckpt, team = saved
  new = make_agent(7, 8, 16, optax.adamw(1e-3), mesh_2d((2, 4)))
  targets = targets_like(team, lambda x: x.sharding)
  ckpt.replace_agent(
      5,
      0,
      new,
      {"name": "swapped"},
      6,
      targets=[None, targets[1]] if with_targets else None,
      cursor={"stage": 4} if with_targets else None,
  )
  ckpt.wait_until_finished()
  assert ckpt.all_steps() == [5, 6]
  states, metas, cursor = ckpt.restore(6, targets)
  assert_same(states[0], new)
  assert_same(states[1], team[1], targets[1])
  assert metas == ({"name": "swapped"}, METAS[1])
  assert cursor == ({"stage": 4} if with_targets else CURSOR)
  old_states, old_metas, _ = ckpt.restore(5, targets)
  assert_same(old_states[0], team[0])
  assert old_metas == tuple(METAS)


def test_errors_name_the_problem(saved, tmp_path):
  ckpt, team = saved
  targets = targets_like(team, lambda x: x.sharding)
  with pytest.raises(checkpoint.CheckpointError, match=r"no step 4 .*\[5\]"):
    ckpt.restore(4, targets)
  with pytest.raises(checkpoint.CheckpointError, match="2 agents, got 1"):
    ckpt.restore(5, targets[:1])
  with pytest.raises(checkpoint.CheckpointError, match="agent index 2 out"):
    ckpt.restore_agent(5, 2, targets[0])
  # Agent 1's target for slot 0: shapes (16, 8) vs saved (8, 16).
  with pytest.raises(
      checkpoint.CheckpointError,
      match=r"agent 0, leaf 'params/b': saved \(16,\) float32, target \(8,\)",
  ):
    ckpt.restore_agent(5, 0, targets[1].replace(opt_state=targets[0].opt_state))
  with pytest.raises(checkpoint.CheckpointError, match="structure differs"):
    ckpt.restore_agent(5, 0, targets[1])  # sgd state vs saved adamw state
  bad_dtype = targets[0].replace(
      beta=jax.ShapeDtypeStruct(
          (), jnp.int32, sharding=targets[0].beta.sharding
      )
  )
  with pytest.raises(checkpoint.CheckpointError, match="'beta'.*int32"):
    ckpt.restore_agent(5, 0, bad_dtype)
  unsharded = targets[0].replace(beta=jax.ShapeDtypeStruct((), jnp.float32))
  with pytest.raises(checkpoint.CheckpointError, match="'beta'.*no sharding"):
    ckpt.restore_agent(5, 0, unsharded)
  with pytest.raises(checkpoint.CheckpointError, match="step 5 already exists"):
    ckpt.save(5, team, METAS, CURSOR)
  with pytest.raises(ValueError, match="2 agent states and 1 metas"):
    ckpt.save(6, team, METAS[:1], CURSOR)
  with pytest.raises(ValueError, match="metadata of agent 1 is not JSON"):
    ckpt.save(6, team, [METAS[0], {"x": np.float32(1)}], CURSOR)
  with pytest.raises(ValueError, match="cursor must be a dict"):
    ckpt.save(6, team, METAS, [1, 2])
  assert ckpt.all_steps() == [5]


def test_a_read_only_reader_leaves_a_save_in_flight_alone(saved):
  ckpt, team = saved
  # What a live run's unfinished save looks like on disk.
  in_flight = ckpt.directory / "7.orbax-checkpoint-tmp"
  in_flight.mkdir()
  (in_flight / "data").write_text("half-written")
  reader = checkpoint.TeamCheckpointer(ckpt.directory, read_only=True)
  assert in_flight.is_dir() and reader.all_steps() == [5]
  target = targets_like(team, lambda x: x.sharding)[1]
  assert_same(reader.restore_agent(5, 1, target)[0], team[1], target)
  with pytest.raises(checkpoint.CheckpointError, match="read-only"):
    reader.save(6, team, METAS, CURSOR)
  with pytest.raises(checkpoint.CheckpointError, match="read-only"):
    reader.replace_agent(5, 0, team[0], METAS[0], 6)
  reader.close()
  assert in_flight.is_dir()
  # A writer clears leftovers (by its first save): why a reader must not be
  # one.
  writer = checkpoint.TeamCheckpointer(ckpt.directory)
  writer.save(6, team, METAS, CURSOR)
  writer.wait_until_finished()
  writer.close()
  assert not in_flight.exists()
  with pytest.raises(checkpoint.CheckpointError, match="no checkpoint folder"):
    checkpoint.TeamCheckpointer(ckpt.directory / "nope", read_only=True)


def test_step_without_team_item_is_rejected(tmp_path):
  manager = ocp.CheckpointManager(tmp_path)
  manager.save(1, args=ocp.args.Composite(x=ocp.args.JsonSave({"a": 1})))
  manager.wait_until_finished()
  manager.close()
  with checkpoint.TeamCheckpointer(tmp_path) as ckpt:
    assert ckpt.all_steps() == [1]
    with pytest.raises(checkpoint.CheckpointError, match="not a team"):
      ckpt.restore_cursor(1)


def test_max_to_keep_removes_old_steps_via_trash(tmp_path):
  team = team_on(mesh_2d((2, 4)))
  with checkpoint.TeamCheckpointer(tmp_path, max_to_keep=2) as ckpt:
    for step in range(4):
      ckpt.save(step, team, METAS, {"stage": step})
    ckpt.wait_until_finished()
    assert ckpt.all_steps() == [2, 3]
    assert ckpt.restore_cursor(3) == {"stage": 3}
  # Deleted steps went through _trash, which close() empties.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "3", "_trash"]
  assert not list((tmp_path / "_trash").iterdir())


# --------------------------------------------------------------- kill -9


def _run_and_kill(directory, delay_s, rng, timeout_s=120.0):
  """Runs the writer, SIGKILLs it `delay_s` after a step starts; done steps."""
  env = dict(os.environ, PYTHONPATH=str(_HERE.parent))
  env.pop("XLA_FLAGS", None)  # the writer sets its own device count
  proc = subprocess.Popen(
      [sys.executable, str(_WRITER), str(directory), "1000"],
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      env=env,
  )
  done = []
  deadline = time.monotonic() + timeout_s
  try:
    # Wait for the first finished step (jax start-up is slow and not what we
    # test), then kill at a random moment of the following saves.
    while not done and time.monotonic() < deadline:
      ready, _, _ = select.select([proc.stdout], [], [], 1.0)
      if ready:
        line = proc.stdout.readline().decode()
        if not line:
          break
        done.append(int(line.split()[1]))
    assert done, f"writer produced no step (exit code {proc.poll()})"
    time.sleep(delay_s + rng.uniform(0.0, 0.05))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rest = proc.stdout.read().decode().splitlines()
    done += [int(line.split()[1]) for line in rest if line.startswith("done")]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  return done


def _check_directory(directory, done):
  """Every listed step restores to exactly its values; the last done is kept."""
  tmp_left = [p.name for p in directory.iterdir() if "tmp" in p.name]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  with checkpoint.TeamCheckpointer(directory, max_to_keep=2) as ckpt:
    steps = ckpt.all_steps()
    assert max(done) in steps, (done, steps)
    assert all(s <= max(done) + 1 for s in steps), (done, steps)
    for step in steps:
      expected = [writer.team_state(step, j) for j in range(writer.NUM_AGENTS)]
      targets = targets_like(expected, lambda x: device)
      states, metas, cursor = ckpt.restore(step, targets)
      for got, want in zip(states, expected):
        assert_same(got, want)
      assert list(metas) == [
          writer.team_meta(step, j) for j in range(writer.NUM_AGENTS)
      ]
      assert cursor == writer.team_cursor(step)
  assert not [p for p in directory.iterdir() if "tmp" in p.name]
  return steps, tmp_left


def _kill_loop(tmp_path, delays, seed):
  rng = random.Random(seed)
  directory = tmp_path / "ckpt"
  interrupted = 0
  last = 0
  for delay in delays:
    done = _run_and_kill(directory, delay, rng)
    # Each writer resumes after the latest step the previous one left.
    assert min(done) == last + 1, (last, done)
    steps, tmp_left = _check_directory(directory, done)
    interrupted += bool(tmp_left)
    last = max(steps)
  return interrupted


def test_kill_minus_nine_never_leaves_a_wrong_checkpoint(tmp_path):
  _kill_loop(tmp_path, delays=[0.0, 0.15, 0.4], seed=0)


@pytest.mark.slow
def test_kill_minus_nine_many_moments(tmp_path):
  rng = random.Random(1)
  delays = [rng.uniform(0.0, 1.0) for _ in range(12)]
  interrupted = _kill_loop(tmp_path, delays, seed=1)
  # Most kills should hit a save in flight, or the test proves little.
  assert interrupted >= len(delays) // 3, interrupted
