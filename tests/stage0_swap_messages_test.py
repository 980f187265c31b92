"""`sat-jax swap` with a model that brings its own tokenizer (per message)."""

import dataclasses
import pathlib
import sys

import jax
import numpy as np
import pytest

from sat_jax import models
from sat_jax import testing
from sat_jax import train
from sat_jax.stage0 import swap as swap_lib

_TESTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
import stage0_swap_test as token_swap  # pylint: disable=g-import-not-at-top,wrong-import-position
import train_e2e_test as e2e  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
  """A one-stage run of a team of random models over the character
  tokenizer (their messages survive a round trip through text)."""
  tmp = tmp_path_factory.mktemp("swap_msg")
  tok = testing.build_char_tokenizer()
  tok.save_pretrained(str(tmp / "tok"))
  config = testing.tiny_config("qwen3", vocab_size=len(tok))
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(5)
  )
  params = jax.tree.map(lambda x: x * 3 if x.ndim >= 2 else x, params)
  models.save_hf(tmp / "model", config, params)
  run = e2e.tiny_train_config(
      str(tmp / "model"), str(tmp / "tok"), num_stages=1
  )
  run = dataclasses.replace(run, sat=dataclasses.replace(run.sat, delta=0.05))
  train.train_and_evaluate(run, tmp / "run", progress=False)
  return tmp, run, tok


def test_the_same_agent_over_other_ids_swaps_in_unchanged_and_trains_on(
    char_run,
):
  """Slot 1's own trained policy, written over a permuted tokenizer: the
  message-level KL to the slot is 0, so nothing is fitted, the slot keeps
  those exact weights with the new tokenizer, and SAT training goes on
  with a team of two tokenizers."""
  tmp, run, tok = char_run
  _, src_states, _, _ = token_swap._restore(tmp / "run", run, 1)
  new_dir = tmp / "permuted"
  new_tok, perm = testing.permuted_tokenizer(tok, tmp / "permuted_tok", seed=3)
  moved = testing.permute_vocab(src_states[1].params, perm)
  models.save_hf(new_dir, models.config_from_hf(run.team[1].model), moved)
  new_tok.save_pretrained(str(new_dir))
  out = tmp / "swapped"
  report = swap_lib.swap(
      tmp / "run",
      1,
      new_dir,
      out,
      fit_overrides={"delta0": 1e-3, "states_per_batch": 8},
      evaluate=False,
  )
  assert report["projection"] == "message"
  (row,) = report["history"]
  assert report["fit_steps"] == 0
  assert row["valid_fraction"] > 0.5  # the check had messages to score
  assert abs(row["kl_mean"]) < 1e-4 and abs(row["kl_max"]) < 1e-4

  new_run = train.load_run_config(out)
  assert new_run.team[1].tokenizer == str(new_dir.resolve())
  assert new_run.team[0] == run.team[0] and new_run.team[2] == run.team[2]
  team, states, metas, _ = token_swap._restore(out, new_run, 0)
  assert metas[1]["tokenizer"] == str(new_dir.resolve())
  assert team.tokenizers[1].get_vocab() != team.tokenizers[0].get_vocab()
  jax.tree.map(np.testing.assert_array_equal, states[1].params, moved)
  for j in (0, 2):
    jax.tree.map(np.testing.assert_array_equal, states[j], src_states[j])

  summary = train.train_and_evaluate(new_run, out, progress=False)
  assert summary["stages_completed"] == 1


def test_a_model_with_another_tokenizer_is_refused_by_the_product_of_experts(
    char_run, tmp_path
):
  tmp, run, tok = char_run
  new_dir = tmp_path / "other"
  new_tok, _ = testing.permuted_tokenizer(tok, tmp_path / "other_tok", seed=4)
  config = models.config_from_hf(run.team[0].model)
  models.save_hf(
      new_dir,
      config,
      jax.jit(models.init_params, static_argnums=0)(config, jax.random.key(0)),
  )
  new_tok.save_pretrained(str(new_dir))
  team, states, _, _ = token_swap._restore(tmp / "run", run, 1)
  with pytest.raises(swap_lib.SwapError, match="decoding-time product"):
    swap_lib.product_team(
        team,
        [s.params for s in states],
        0,
        new_dir,
        0.1,
        np.float32,
        jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)),
    )
