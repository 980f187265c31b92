"""Tests of safetensors load/save: transformers round trips and bad folders."""

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file
import torch
import transformers

from sat_jax import models
from sat_jax import sharding
from sat_jax import testing

_forward = jax.jit(models.forward, static_argnums=0)


@pytest.fixture(scope="module")
def qwen2_dir(tmp_path_factory):
  """Tiny Qwen2 (biases) saved by transformers."""
  return testing.save_tiny_hf_model(
      tmp_path_factory.mktemp("hf") / "qwen2", "qwen2", seed=5
  )


def _tokens():
  return np.random.default_rng(1).integers(0, 512, (2, 9)).astype(np.int32)


def _torch_logits(path, tokens):
  model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  with torch.no_grad():
    return model(
        input_ids=torch.tensor(tokens, dtype=torch.long)
    ).logits.numpy()


def test_save_is_loaded_by_transformers_with_same_logits(tmp_path, qwen2_dir):
  config, params = models.load_hf(qwen2_dir)
  out = models.save_hf(tmp_path / "out", config, params)
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  tokens = _tokens()
  np.testing.assert_allclose(
      _torch_logits(out, tokens),
      _forward(config, params, tokens, np.ones_like(tokens)),
      atol=1e-4,
  )
  # Tensor-for-tensor equal to what transformers itself saved.
  ours, theirs = load_file(out / "model.safetensors"), load_file(
      qwen2_dir / "model.safetensors"
  )
  assert sorted(ours) == sorted(theirs)
  for name in theirs:
    np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_sharded_save_and_load_round_trip(tmp_path):
  config = testing.tiny_config("llama")
  params = jax.jit(models.init_params, static_argnums=0)(
      config, jax.random.key(0)
  )
  out = models.save_hf(
      tmp_path / "sharded", config, params, max_shard_bytes=100_000
  )
  index = json.loads((out / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert (
      len(files) > 2
      and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
  )
  assert not (out / "model.safetensors").exists()
  config2, params2 = models.load_hf(out)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params, params2)
  tokens = _tokens()
  np.testing.assert_allclose(
      _torch_logits(out, tokens),
      _forward(config, params, tokens, np.ones_like(tokens)),
      atol=1e-4,
  )


def test_loads_a_checkpoint_sharded_by_transformers(tmp_path):
  path = testing.save_tiny_hf_model(
      tmp_path / "m", "qwen3", tie=True, max_shard_size="60KB"
  )
  assert (path / "model.safetensors.index.json").exists()
  config, params = models.load_hf(path)
  tokens = _tokens()
  np.testing.assert_allclose(
      _torch_logits(path, tokens),
      _forward(config, params, tokens, np.ones_like(tokens)),
      atol=1e-4,
  )


def test_bfloat16_save_and_load(tmp_path, qwen2_dir):
  config, params = models.load_hf(qwen2_dir, dtype=jnp.bfloat16)
  out = models.save_hf(tmp_path / "bf16", config, params)
  assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
  stored = load_file(out / "model.safetensors")
  assert {a.dtype for a in stored.values()} == {np.dtype(ml_dtypes.bfloat16)}
  _, kept = models.load_hf(out, dtype=None)
  assert {x.dtype for x in jax.tree.leaves(kept)} == {jnp.dtype(jnp.bfloat16)}
  jax.tree.map(np.testing.assert_array_equal, params, kept)
  _, as_f32 = models.load_hf(out)
  assert as_f32["embed"].dtype == jnp.float32
  # save with a dtype conversion
  out32 = models.save_hf(tmp_path / "f32", config, params, dtype=jnp.float32)
  assert (
      load_file(out32 / "model.safetensors")["model.norm.weight"].dtype
      == np.float32
  )


def test_save_is_atomic_and_refuses_to_overwrite(tmp_path, qwen2_dir):
  config, params = models.load_hf(qwen2_dir)
  out = models.save_hf(
      tmp_path / "x", config, params, extra_config={"eos_token_id": 3}
  )
  assert json.loads((out / "config.json").read_text())["eos_token_id"] == 3
  with pytest.raises(FileExistsError, match="overwrite=True"):
    models.save_hf(out, config, params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  models.save_hf(out, config, zeros, overwrite=True)
  _, back = models.load_hf(out)
  assert float(jnp.abs(back["embed"]).max()) == 0.0
  assert sorted(os.listdir(tmp_path)) == ["x"]  # no temporary folders left
  bad = dict(params, embed=params["embed"][:, :10])
  with pytest.raises(models.CheckpointError, match=r"\['embed'\] has shape"):
    models.save_hf(tmp_path / "y", config, bad)
  assert sorted(os.listdir(tmp_path)) == ["x"]
  with pytest.raises(models.ConfigError, match="contradicts"):
    models.save_hf(
        tmp_path / "z", config, params, extra_config={"vocab_size": 1}
    )


def _copy_with(src, dst, edit):
  """Copies a checkpoint folder, editing its tensor dict with `edit`."""
  dst.mkdir()
  (dst / "config.json").write_text((src / "config.json").read_text())
  tensors = load_file(src / "model.safetensors")
  edit(tensors)
  save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
  return dst


def test_missing_tensor_is_named(tmp_path, qwen2_dir):
  name = "model.layers.1.self_attn.k_proj.bias"
  path = _copy_with(qwen2_dir, tmp_path / "m", lambda t: t.pop(name))
  with pytest.raises(models.CheckpointError, match=f"missing tensor {name}"):
    models.load_hf(path)


def test_misshaped_tensor_is_named_with_both_shapes(tmp_path, qwen2_dir):
  name = "model.layers.0.mlp.up_proj.weight"

  def edit(t):
    t[name] = t[name][:100]

  path = _copy_with(qwen2_dir, tmp_path / "m", edit)
  with pytest.raises(
      models.CheckpointError,
      match=rf"{name} has shape \(100, 64\), expected \(128, 64\)",
  ):
    models.load_hf(path)


def test_unexpected_tensor_is_named(tmp_path, qwen2_dir):
  def edit(t):
    t["model.layers.0.self_attn.o_proj.bias"] = np.zeros(64, np.float32)

  path = _copy_with(qwen2_dir, tmp_path / "m", edit)
  with pytest.raises(
      models.CheckpointError, match="unexpected tensor .*o_proj.bias"
  ):
    models.load_hf(path)


def test_inconsistent_head_counts_in_config(tmp_path, qwen2_dir):
  path = _copy_with(qwen2_dir, tmp_path / "m", lambda t: None)
  hf = json.loads((path / "config.json").read_text())
  hf["num_key_value_heads"] = 3
  (path / "config.json").write_text(json.dumps(hf))
  with pytest.raises(
      models.ConfigError, match="not divisible by num_kv_heads=3"
  ):
    models.load_hf(path)


def test_missing_files(tmp_path, qwen2_dir):
  with pytest.raises(models.ConfigError, match="no such file"):
    models.load_hf(tmp_path)
  (tmp_path / "config.json").write_text((qwen2_dir / "config.json").read_text())
  with pytest.raises(models.CheckpointError, match="neither model.safetensors"):
    models.load_hf(tmp_path)
  (tmp_path / "model.safetensors.index.json").write_text(
      json.dumps({"weight_map": {"model.norm.weight": "gone.safetensors"}})
  )
  with pytest.raises(
      models.CheckpointError, match="gone.safetensors, which is missing"
  ):
    models.load_hf(tmp_path)


def test_load_places_params_on_given_shardings(qwen2_dir):
  mesh = jax.make_mesh(
      (2, 2, 2),
      ("data", "fsdp", "tensor"),
      axis_types=(jax.sharding.AxisType.Auto,) * 3,
  )
  config = models.config_from_hf(qwen2_dir)
  shardings = jax.tree.map(
      lambda names: jax.sharding.NamedSharding(
          mesh, sharding.logical_to_spec(names)
      ),
      models.param_axes(config),
      is_leaf=lambda x: isinstance(x, tuple),
  )
  _, params = models.load_hf(qwen2_dir, shardings=shardings)
  assert params["layers"]["up_proj"].sharding == shardings["layers"]["up_proj"]
  assert tuple(params["embed"].sharding.spec) == ("tensor", "fsdp")
  _, plain = models.load_hf(qwen2_dir)
  jax.tree.map(np.testing.assert_array_equal, params, plain)
