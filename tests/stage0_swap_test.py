"""`sat-jax swap` on a tiny trained run, then SAT training goes on."""

import dataclasses
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from sat_jax import checkpoint as checkpoint_lib
from sat_jax import export as export_lib
from sat_jax import models
from sat_jax import scoring
from sat_jax import team as team_lib
from sat_jax import testing
from sat_jax import train
from sat_jax.core import objective
from sat_jax.stage0 import swap as swap_lib
from sat_jax.tasks import registry

_TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
import train_e2e_test as e2e  # pylint: disable=g-import-not-at-top,wrong-import-position


def _new_model(path, **arch):
  """A peaked random model over the tiny vocabulary (far from the team)."""
  config = testing.tiny_config("qwen3", **arch)
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(11)
  )
  params = jax.tree.map(lambda x: x * 4 if x.ndim >= 2 else x, params)
  models.save_hf(path, config, params)
  return path


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("swap")
  model_dir, tok_dir = e2e.make_tiny_model(tmp)
  config = e2e.tiny_train_config(model_dir, tok_dir, num_stages=1)
  config = dataclasses.replace(
      config, sat=dataclasses.replace(config.sat, delta=0.05)
  )
  train.train_and_evaluate(config, tmp / "run", progress=False)
  return tmp, config


def _restore(workdir, config, step):
  task = registry.get_task(config.task.name, **config.task.kwargs)
  mesh = jax.make_mesh(
      (1, 1, 1),
      ("data", "fsdp", "tensor"),
      axis_types=(jax.sharding.AxisType.Auto,) * 3,
      devices=jax.devices()[:1],
  )
  with jax.set_mesh(mesh):
    team = train.build_team(config, task, workdir, mesh, allow_pretrain=False)
    with checkpoint_lib.TeamCheckpointer(
        workdir / "checkpoints", read_only=True
    ) as ckpt:
      states, metas, cursor = ckpt.restore(
          step, train.initial_state(team, config)
      )
  return team, jax.device_get(states), metas, cursor


def test_swap_changes_one_slot_fits_its_trust_region_and_training_goes_on(
    source_run,
):
  tmp, config = source_run
  new_dir = _new_model(tmp / "stronger", num_layers=1, hidden_size=48)
  out = tmp / "swapped"
  report = swap_lib.swap(
      tmp / "run",
      1,
      new_dir,
      out,
      fit_overrides={"learning_rate": 1e-2, "max_steps": 120},
  )
  # The new model was outside slot 1's region and was fitted into it.
  history = report["history"]
  assert history[0]["kl_quantile"] > 0.05
  assert report["fit_steps"] > 0 and history[-1]["kl_quantile"] <= 0.05
  saved = json.loads((out / "swap.json").read_text())
  assert saved["history"] == history
  assert set(saved["eval_after"]) >= {"avg@2"}

  new_config = train.load_run_config(out)
  assert new_config.team[1].model == str(new_dir.resolve())
  assert new_config.team[0] == config.team[0]
  assert new_config.team[2] == config.team[2]
  src_team, src_states, _, _ = _restore(tmp / "run", config, 1)
  new_team, new_states, metas, cursor = _restore(out, new_config, 0)
  assert cursor["stage"] == 0 and metas[1]["swapped_from_step"] == 1
  for j in (0, 2):  # copied value for value, optimizer state included
    jax.tree.map(np.testing.assert_array_equal, new_states[j], src_states[j])
  assert new_team.agents[1].config.num_layers == 1
  # An independent monitor on a fresh rollout of the source team: the
  # states of slot 1 under the team it joins.
  task = registry.get_task(config.task.name, **config.task.kwargs)
  rollout = team_lib.make_rollout_fn(
      src_team.agents,
      src_team.tokenizers,
      task,
      task.load("train"),
      config.protocol,
      num_prompts=2,
      group_size=2,
  )
  src_params = [s.params for s in src_states]
  view = rollout(tuple(src_params), jax.random.key(99)).views[1]
  kl = scoring.state_kl(
      new_team.agents[1].config,
      new_states[1].params,
      models.config_from_hf(config.team[1].model),
      src_params[1],
      view.inputs["tokens_ExT"],
      view.inputs["mask_ExT"],
  )
  assert float(objective.masked_mean(kl, view.mask_ExT)) <= 0.05
  # Untrained optimizer state for the new slot.
  assert int(jax.tree.leaves(new_states[1].opt_state)[0]) == 0

  summary = train.train_and_evaluate(new_config, out, progress=False)
  assert summary["stages_completed"] == 1
  assert set(summary["accuracy"]) == {0, 1}
  assert summary["accuracy"][0] == report["eval_after"]["avg@2"]


def test_swap_refuses_bad_requests_and_writes_nothing(source_run, tmp_path):
  tmp, _ = source_run
  new_dir = _new_model(tmp_path / "m")
  with pytest.raises(swap_lib.SwapError, match="agent=3"):
    swap_lib.swap(tmp / "run", 3, new_dir, tmp_path / "o1")
  wide = _new_model(tmp_path / "wide", vocab_size=testing.TINY_VOCAB + 64)
  with pytest.raises(swap_lib.SwapError, match="vocab_size"):
    swap_lib.swap(tmp / "run", 0, wide, tmp_path / "o2")
  (tmp_path / "o3").mkdir()
  with pytest.raises(swap_lib.SwapError, match="exists"):
    swap_lib.swap(tmp / "run", 0, new_dir, tmp_path / "o3")
  # Fitting that cannot reach the region in 1 step: nothing written.
  with pytest.raises(swap_lib.SwapError, match="still above"):
    swap_lib.swap(
        tmp / "run",
        0,
        new_dir,
        tmp_path / "o4",
        fit_overrides={"max_steps": 1, "learning_rate": 1e-6},
        evaluate=False,
    )
  # A misspelt fit setting is named, not silently dropped.
  with pytest.raises(swap_lib.SwapError, match=r"\['learning_rat'\]"):
    swap_lib.swap(
        tmp / "run",
        0,
        new_dir,
        tmp_path / "o5",
        fit_overrides={"learning_rat": 1e-2},
        evaluate=False,
    )
  assert not (tmp_path / "o1").exists() and not (tmp_path / "o4").exists()
  assert not (tmp_path / "o5").exists()
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_export_then_swap_the_same_agent_back_is_the_identity(
    source_run, tmp_path
):
  tmp, config = source_run
  exported = export_lib.export(tmp / "run", 2, tmp_path / "agent2")
  _, src_states, _, _ = _restore(tmp / "run", config, 1)
  _, params = models.load_hf(exported)
  jax.tree.map(np.testing.assert_array_equal, params, src_states[2].params)
  assert (
      models.load_tokenizer(exported).get_vocab()
      == models.load_tokenizer(config.team[2].tokenizer).get_vocab()
  )
  with pytest.raises(FileExistsError, match="exists"):
    export_lib.export(tmp / "run", 2, tmp_path / "agent2")
  # Already inside the region (KL 0): no fitting, the same parameters.
  report = swap_lib.swap(
      tmp / "run", 2, exported, tmp_path / "same", evaluate=False
  )
  assert report["fit_steps"] == 0
  assert report["history"][0]["kl_quantile"] == 0.0
  new_config = train.load_run_config(tmp_path / "same")
  _, new_states, _, _ = _restore(tmp_path / "same", new_config, 0)
  jax.tree.map(
      np.testing.assert_array_equal,
      [s.params for s in new_states],
      [s.params for s in src_states],
  )


@pytest.mark.slow  # a fresh process compiles everything again (~60 s)
def test_the_train_command_goes_on_with_a_run_directory_alone(
    source_run, tmp_path
):
  tmp, _ = source_run
  exported = export_lib.export(tmp / "run", 0, tmp_path / "agent0")
  out = tmp_path / "swapped"
  swap_lib.swap(tmp / "run", 0, exported, out, evaluate=False)
  cli = (
      f"import sys; sys.path.insert(0, {str(_TESTS)!r}); import"
      " train_e2e_test; from sat_jax import main; main.run(['sat-jax',"
      " 'train'] + sys.argv[1:])"
  )
  proc = subprocess.run(
      [sys.executable, "-c", cli, f"--workdir={out}", "--num_stages=2"],
      capture_output=True,
      text=True,
      timeout=900,
      check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "resuming after stage 0" in proc.stderr
  summary = json.loads((out / "summary.json").read_text())
  assert summary["stages_completed"] == 2
  assert train.load_run_config(out).num_stages == 2


def test_own_tokenizer_tells_another_vocabulary_from_another_template(
    tmp_path, caplog
):
  slot_dir = pathlib.Path(testing.build_tiny_tokenizer(tmp_path / "slot"))
  slot = models.load_tokenizer(slot_dir)
  bare = tmp_path / "bare"
  bare.mkdir()
  assert swap_lib.own_tokenizer(bare, slot) is None  # no tokenizer files
  assert swap_lib.own_tokenizer(slot_dir, slot) is None  # the slot's own
  other = pathlib.Path(
      testing.build_tiny_tokenizer(tmp_path / "other", vocab_size=300)
  )
  assert swap_lib.own_tokenizer(other, slot).get_vocab() != slot.get_vocab()
  # The slot's vocabulary under another chat template: the token-level
  # path (None), with a warning that the template is not used.
  templated = tmp_path / "templated"
  templated.mkdir()
  for f in slot_dir.iterdir():
    (templated / f.name).write_bytes(f.read_bytes())
  jinja = templated / "chat_template.jinja"
  jinja.write_text("{# another template #}" + jinja.read_text())
  with caplog.at_level("WARNING"):
    assert swap_lib.own_tokenizer(templated, slot) is None
  assert "other chat template" in caplog.text
  assert "tokenization rules" not in caplog.text
