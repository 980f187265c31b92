"""The same 2-stage run on 1 device and on 8 (2x4x1, 2x2x2) agrees.

Tolerance: integers, booleans and rewards exactly (the same tokens are
sampled: the uniforms are per row, and float differences of the sharded
reductions never move a draw across a token boundary at this size); other
floats within rel 1e-3 or abs 1e-5 (KLs and gains are differences of
nearly equal log-probs, summed in another order when sharded). Parameters:
per tensor, the two runs end within 1% (in L2 norm) of how far training
moved that tensor, and no coordinate is more than 5e-4 (1/6 of a learning
rate) apart; a wrong sharded gradient moves whole tensors elsewhere and
fails the first bound. A per-coordinate atol alone is machine-dependent:
CI measured one coordinate of 4,096 at 6.5e-5 where this machine saw
1.2e-5. Adam's eps is raised to 1e-6 here: with the default 1e-8, a
coordinate whose gradient is ~1e-9 (float noise around zero, e.g. the
embedding rows of tokens that never occur) moves by up to a whole learning
rate (3e-3) in a direction set by that noise, whatever the sharding does
(measured: 2.6e-4 apart). With eps = 1e-6 the update is lr / eps =
3e3-Lipschitz in the gradient, so gradient noise of ~1e-8 leaves the runs
~1e-5 apart per coordinate.
"""

import dataclasses
import json
import math
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from sat_jax import config as config_lib
from sat_jax import metrics as metrics_lib
from sat_jax import models
from sat_jax import sharding
from sat_jax import train

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import train_e2e_test as e2e  # pylint: disable=g-import-not-at-top,wrong-import-position

tiny_model = e2e.tiny_model  # the session fixture


def _close(a, b) -> bool:
  if isinstance(a, float) or isinstance(b, float):
    return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-5)
  return a == b


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory, tiny_model):
  """(config, workdir) of the 2-stage run on one device (module-wide)."""
  config = e2e.tiny_train_config(*tiny_model)
  update = config.sat.update
  optimizer = dataclasses.replace(update.optimizer, eps=1e-6)
  config = dataclasses.replace(
      config,
      sat=dataclasses.replace(
          config.sat, update=dataclasses.replace(update, optimizer=optimizer)
      ),
  )
  workdir = tmp_path_factory.mktemp("one")
  one = sharding.make_mesh(config.mesh, jax.devices()[:1])
  train.train_and_evaluate(config, workdir, one, progress=False)
  return config, workdir


def _assert_same_rows(dir_one, dir_other):
  rows_one = e2e.comparable_rows(dir_one)
  rows_other = e2e.comparable_rows(dir_other)
  assert [(r["step"], r["kind"]) for r in rows_other] == [
      (r["step"], r["kind"]) for r in rows_one
  ]
  for a, b in zip(rows_one, rows_other):
    assert a.keys() == b.keys()
    bad = {k: (a[k], b[k]) for k in a if not _close(a[k], b[k])}
    assert not bad, (a["step"], a["kind"], bad)
  stage = [r for r in rows_one if r["kind"] == "stage"]
  assert {r["reward"] for r in stage} != {0.0}  # the runs had signal


# 2x2x2 runs by default (every axis > 1); 2x4x1 with the slow tests.
@pytest.mark.parametrize(
    "axes", [pytest.param((2, 4, 1), marks=pytest.mark.slow), (2, 2, 2)]
)
def test_sharded_run_matches_one_device(
    tmp_path, tiny_model, one_device_run, axes
):
  config, dir_one = one_device_run
  one = sharding.make_mesh(config.mesh, jax.devices()[:1])
  mesh_config = sharding.MeshConfig(axes=tuple(zip(sharding.MESH_AXES, axes)))
  mesh = sharding.make_mesh(mesh_config)
  assert dict(mesh.shape) == dict(zip(sharding.MESH_AXES, axes))
  train.train_and_evaluate(config, tmp_path / "many", mesh, progress=False)
  _assert_same_rows(dir_one, tmp_path / "many")
  params_one, _ = e2e.final_params(dir_one, config, one)
  params_many, _ = e2e.final_params(tmp_path / "many", config, one)
  start = jax.device_get(models.load_hf(tiny_model[0])[1])
  for j, (p_one, p_many) in enumerate(zip(params_one, params_many)):
    for path, x, y, s in zip(
        jax.tree_util.tree_leaves_with_path(start),
        jax.tree.leaves(p_one),
        jax.tree.leaves(p_many),
        jax.tree.leaves(start),
    ):
      name = f"agent {j} {jax.tree_util.keystr(path[0])}"
      moved = np.linalg.norm(x - s)
      apart = np.linalg.norm(y - x)
      assert apart <= 1e-2 * moved + 1e-6, (name, apart, moved)
      assert np.abs(y - x).max() <= 5e-4, (name, np.abs(y - x).max())
  # The sharded run's parameters really were spread over the mesh.
  with jax.set_mesh(mesh):
    task = e2e.ParityTask(6)
    team = train.build_team(config, task, tmp_path / "many", mesh)
  embed = team.params[0]["embed"]
  assert len(embed.sharding.device_set) == 8
  assert embed.sharding.shard_shape(embed.shape) != embed.shape


def test_sampler_on_a_mesh_of_its_own_matches_one_device(
    tmp_path, one_device_run, monkeypatch
):
  # Training on device 0, the sampler (rollouts and evaluation) over
  # devices 0-1, set by the config alone: the same run.
  config, dir_one = one_device_run
  meshes = []  # the sampling mesh of every rollout / evaluation function

  def spy(make):
    def wrapped(*args, **kwargs):
      meshes.append(kwargs.get("sampling_mesh"))
      return make(*args, **kwargs)

    return wrapped

  for name in ("make_rollout_fn", "make_generate_fn"):
    monkeypatch.setattr(
        train.team_lib, name, spy(getattr(train.team_lib, name))
    )
  config = dataclasses.replace(
      config,
      mesh=sharding.MeshConfig(num_devices=1),
      rollout=dataclasses.replace(
          config.rollout, mesh=sharding.MeshConfig(num_devices=2)
      ),
  )
  train.train_and_evaluate(config, tmp_path / "split", progress=False)
  assert len(meshes) >= 2  # the stage rollouts and the evaluations
  assert all(m is not None and m.size == 2 for m in meshes), meshes
  _assert_same_rows(dir_one, tmp_path / "split")


_CONFIG_FILE = """
import json
import sys

sys.path.insert(0, {tests!r})
import train_e2e_test  # registers the test task

from sat_jax import config as config_lib


def get_config(arg=None):
  with open({path!r}) as f:
    return config_lib.to_config_dict(config_lib.from_dict(json.load(f)))
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run_two_processes(tmp_path, config_py, workdir, tag, *overrides):
  """Runs `sat-jax train` as two processes of one job; returns their logs."""
  port = _free_port()
  procs, logs = [], []
  for i in range(2):
    env = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        JAX_PLATFORMS="cpu",
        SAT_JAX_DISTRIBUTED="1",
        JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
        JAX_NUM_PROCESSES="2",
        JAX_PROCESS_ID=str(i),
    )
    logs.append(tmp_path / f"{tag}_process_{i}.log")
    with open(logs[-1], "wb") as log:
      procs.append(
          subprocess.Popen(
              [
                  sys.executable,
                  "-m",
                  "sat_jax.main",
                  "train",
                  f"--config={config_py}",
                  f"--workdir={workdir}",
                  *overrides,
              ],
              env=env,
              stdout=log,
              stderr=subprocess.STDOUT,
          )
      )
  try:
    codes = [p.wait(timeout=600) for p in procs]
  finally:
    for p in procs:
      p.kill()
  tails = "\n".join(
      f"--- {tag}, process {i} ---\n" + log.read_text(errors="replace")[-3000:]
      for i, log in enumerate(logs)
  )
  assert codes == [0, 0], tails
  return logs


def test_two_process_run_resumes_and_matches_one_device(
    tmp_path, tiny_model, one_device_run
):
  # Multi-host as on a pod: two `sat-jax train` processes with 4 CPU devices
  # each (gloo between them), one 2x2x2 mesh over all 8, the same workdir.
  # The job first stops after stage 1 and is then rerun to its 2 stages, as
  # a preempted pod job is: both processes restore the stage-1 checkpoint and
  # continue. Only process 0 writes run files (duplicated metrics rows would
  # fail the row comparison); the checkpoint both wrote restores on one
  # device.
  config_one, dir_one = one_device_run
  assert config_one.num_stages == 2
  config = dataclasses.replace(
      config_one,
      mesh=sharding.MeshConfig(axes=tuple(zip(sharding.MESH_AXES, (2, 2, 2)))),
  )
  config_json = tmp_path / "config.json"
  config_json.write_text(json.dumps(config_lib.to_dict(config)))
  config_py = tmp_path / "two_process.py"
  config_py.write_text(
      _CONFIG_FILE.format(
          tests=str(pathlib.Path(__file__).resolve().parent),
          path=str(config_json),
      )
  )
  workdir = tmp_path / "two"
  _run_two_processes(
      tmp_path, config_py, workdir, "first", "--config.num_stages=1"
  )
  one = sharding.make_mesh(config_one.mesh, jax.devices()[:1])
  _, cursor = e2e.final_params(workdir, config_one, one)
  assert cursor["stage"] == 1
  logs = _run_two_processes(tmp_path, config_py, workdir, "rerun")
  for log in logs:  # both processes restored stage 1 and ran stage 2 only
    assert "resuming after stage 1" in log.read_text(errors="replace")
  _assert_same_rows(dir_one, workdir)
  params_one, _ = e2e.final_params(dir_one, config_one, one)
  params_two, cursor = e2e.final_params(workdir, config_one, one)
  assert cursor["stage"] == config.num_stages
  for j, (p_one, p_two) in enumerate(zip(params_one, params_two)):
    for x, y in zip(jax.tree.leaves(p_one), jax.tree.leaves(p_two)):
      assert np.abs(y - x).max() <= 5e-4, j
