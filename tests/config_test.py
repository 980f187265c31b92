"""Tests of sat_jax.config: ConfigDict files in, validated dataclasses out."""

import dataclasses
import pathlib
import sys

from absl import flags
from ml_collections import config_flags
import pytest

from sat_jax import config as config_lib
from sat_jax import sharding
from sat_jax.core import config as core_config

_REPO = pathlib.Path(__file__).resolve().parent.parent
_DEMO = str(_REPO / "experiments" / "demo.py")
sys.path.insert(0, str(_REPO / "experiments"))
import demo  # pylint: disable=g-import-not-at-top,wrong-import-position


def _parse(*args: str):
  """The ConfigDict the command line `--config <args...>` gives."""
  values = flags.FlagValues()
  argv = ["prog", *args]
  config_flags.DEFINE_config_file(
      "config", None, flag_values=values, sys_argv=argv
  )
  values(argv)
  return values.config


def _demo(**changes) -> dict:
  values = config_lib.to_plain(demo.get_config())
  for path, value in changes.items():
    *parents, leaf = path.split(".")
    node = values
    for p in parents:
      node = node[int(p)] if p.isdigit() else node[p]
    node[leaf] = value
  return values


def test_demo_config_is_the_issue_demo():
  config = config_lib.from_dict(demo.get_config())
  assert config.num_agents == 3
  assert {e.model for e in config.team} == {config_lib.PRETRAIN}
  assert config.protocol.protocol == "relay"
  assert config.sat.method == "sat"
  assert config.sat.advantage_mode == "reuse"
  assert config.task.name == "arithmetic"
  assert config.rollout.group_size >= 2


def test_json_round_trip_is_exact():
  config = config_lib.from_dict(demo.get_config())
  again = config_lib.from_dict(config_lib.to_dict(config))
  assert again == config
  # Tuples survive JSON's lists.
  assert isinstance(again.mesh.axes[0], tuple)
  assert isinstance(again.protocol.view_buckets, tuple)


def test_command_line_overrides_reach_the_dataclasses():
  cd = _parse(
      f"--config={_DEMO}:method=joint,stages=3",
      "--config.sat.delta=0.02",
      "--config.team[1].delta=0.1",
      "--config.team[2].beta_init=0.5",
      "--config.sat.agent_update.epochs=4",
      "--config.sat.agent_update.optimizer.learning_rate=0.002",
      "--config.eval.temperature=0.0",
      "--config.task.kwargs.digits=2",
  )
  config = config_lib.from_dict(cd)
  assert config.sat.method == "joint" and config.num_stages == 3
  assert config.agent_deltas() == (0.02, 0.1, 0.02)
  assert config.sat_config().delta == (0.02, 0.1, 0.02)
  assert config.team[2].beta_init == 0.5 and config.team[0].beta_init is None
  # The per-agent beta_init reaches the core, which decays beta toward it.
  assert config.agent_beta_inits() == (0.01, 0.01, 0.5)
  assert config.sat_config().beta_init == (0.01, 0.01, 0.5)
  assert config.sat.update.epochs == 4
  assert config.sat.update.optimizer.learning_rate == 0.002
  assert config.eval.temperature == 0.0
  assert config.task.kwargs["digits"] == 2


def test_a_sampler_mesh_of_its_own():
  config = config_lib.from_dict(_demo())
  assert config.rollout.mesh is None  # the sampler uses the training mesh
  values = _demo(**{"rollout.mesh": {"num_devices": 2}, "mesh.num_devices": 1})
  config = config_lib.from_dict(values)
  assert config.rollout.mesh == sharding.MeshConfig(num_devices=2)
  assert config.mesh.num_devices == 1
  assert config_lib.from_dict(config_lib.to_dict(config)) == config
  # The demo's arg sets both, through the ConfigDict placeholder.
  config = config_lib.from_dict(_parse(f"--config={_DEMO}:sampler_devices=2"))
  assert config.rollout.mesh == sharding.MeshConfig(num_devices=2)
  assert config.mesh.num_devices == 1


def test_uniform_deltas_fold_back_to_a_scalar():
  config = config_lib.from_dict(_demo(**{"sat.delta": 0.03}))
  assert config.sat_config().delta == 0.03


def test_temperature_per_agent():
  config = config_lib.from_dict(
      _demo(**{"team.1.temperature": 0.7, "rollout.temperature": 1.1})
  )
  assert [config.agent_temperature(j) for j in range(3)] == [1.1, 0.7, 1.1]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"protocol.protocol": "chain"}, "protocol='chain'"),
        ({"protocol.router": "everyone"}, "router='everyone'"),
        ({"rollout.group_size": 1}, "rollout.group_size=1"),
        ({"team.0.model": "/no/such/model"}, "model='/no/such/model'"),
        ({"team.2.tokenizer": "/no/such/tok"}, "tokenizer='/no/such/tok'"),
        ({"sat.method": "magic"}, "method='magic'"),
        ({"sat.single_agent": 5, "sat.method": "single"}, "single_agent=5"),
        ({"sat.agent_update.minibatches": 3}, "minibatches=3"),
        ({"sat.dleta": 0.1}, "unknown field(s) ['dleta']"),
        ({"team.0.temperature": 0.0}, "temperature=0.0"),
        # A zero beta with a finite delta: backtracking could not change a try.
        (
            {"team.1.beta_init": 0.0, "sat.backtrack_step_scale": 1.0},
            "beta_init=0 for agent 1",
        ),
        ({"eval.k": 0}, "eval.k=0"),
        ({"pretrain.wrong_prob": 1.5}, "wrong_prob=1.5"),
        ({"mesh.axes": [["data", 3], ["model", 1]]}, "unknown axis 'model'"),
        ({"rollout.mesh": {"num_devices": 0}}, "num_devices=0"),
        ({"rollout.mesh": {"devices": 2}}, "rollout.mesh: unknown field"),
        ({"num_stages": -1}, "num_stages=-1"),
    ],
)
def test_bad_input_names_the_field(changes, message):
  with pytest.raises(ValueError) as e:
    config_lib.from_dict(_demo(**changes))
  assert message in str(e.value)


def test_per_agent_delta_tuple_must_match_the_team():
  values = _demo(**{"sat.delta": [0.1, 0.2]})
  with pytest.raises(ValueError, match="2 entries for a team of 3"):
    config_lib.from_dict(values)


def test_the_core_spelling_of_update_is_accepted():
  values = _demo()
  values["sat"]["update"] = values["sat"].pop("agent_update")
  assert config_lib.from_dict(values) == config_lib.from_dict(_demo())
  values["sat"]["agent_update"] = values["sat"]["update"]
  with pytest.raises(ValueError, match="both 'update' and 'agent_update'"):
    config_lib.from_dict(values)


def test_config_dict_of_defaults_has_every_field_overridable():
  defaults = config_lib.TrainConfig(team=(config_lib.AgentEntry(),))
  cd = config_lib.to_config_dict(defaults)
  # None fields are placeholders, so the command line can set them.
  assert cd.team[0].tokenizer is None
  cd.team[0].delta = 0.3
  cd.sat.agent_update.epsilon_high = 0.28
  config = config_lib.from_dict(cd)
  assert config.team[0].delta == 0.3
  assert config.sat.update.epsilon_high == 0.28
  assert dataclasses.replace(
      config,
      team=defaults.team,
      sat=dataclasses.replace(config.sat, update=core_config.UpdateConfig()),
  ) == dataclasses.replace(
      defaults,
      sat=dataclasses.replace(defaults.sat, update=core_config.UpdateConfig()),
  )


def test_default_workdir():
  config = config_lib.from_dict(_demo(name=""))
  assert config_lib.default_workdir(config, "experiments/x.py:smoke") == (
      pathlib.Path("runs/x")
  )
  named = config_lib.from_dict(_demo())
  assert config_lib.default_workdir(named) == pathlib.Path("runs/demo")
