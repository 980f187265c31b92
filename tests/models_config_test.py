"""Tests of ModelConfig, the presets and HF config.json reading/writing."""

import json

import jax
import numpy as np
import pytest
import torch
import transformers

from sat_jax import models
from sat_jax import testing
from sat_jax.models import layers

_REAL = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen2.5-3b",
         "llama-3.1-8b")  # fmt: skip


def _hf_config(config: models.ModelConfig):
  """The transformers config of a preset, built from its HF dict."""
  hf = models.config_to_hf(config)
  cls = transformers.CONFIG_MAPPING[hf.pop("model_type")]
  hf.pop("architectures")
  return cls(**hf)


@pytest.mark.parametrize("name", _REAL)
def test_preset_param_count_matches_transformers_meta_model(name):
  config = models.get_preset(name)
  with torch.device("meta"):
    model = transformers.AutoModelForCausalLM.from_config(_hf_config(config))
  hf_count = sum(p.numel() for p in model.parameters())
  assert models.num_params(config) == hf_count
  shapes = jax.eval_shape(lambda: models.init_params(config, jax.random.key(0)))
  assert sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)) == hf_count


def test_published_parameter_counts():
  # Parameter counts stated on the model cards / by transformers.
  counts = {n: models.num_params(models.get_preset(n)) for n in _REAL}
  assert counts["qwen3-0.6b"] == 596_049_920
  assert round(counts["llama-3.1-8b"] / 1e9, 2) == 8.03
  assert round(counts["qwen2.5-3b"] / 1e9, 2) == 3.09
  assert round(counts["qwen3-8b"] / 1e9, 1) == 8.2


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("tie", [False, True])
def test_config_from_transformers_json(tmp_path, family, tie):
  testing.hf_tiny_config(family, tie).save_pretrained(tmp_path)
  got = models.config_from_hf(tmp_path)
  assert got == testing.tiny_config(family, tie_embeddings=tie)
  assert got.qkv_bias == (family == "qwen2")
  assert got.qk_norm == (family == "qwen3")


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("kv_heads", ["absent", None])
def test_fields_left_out_read_as_transformers_reads_them(family, kv_heads):
  # Qwen3-4B's width with 64 heads, without head_dim, num_key_value_heads
  # (left out or null) and max_position_embeddings: each family's config
  # class fills them in its own way (Qwen3: head_dim 128, not 2560 // 64 =
  # 40; Qwen: 32 kv heads when left out, not the 64 heads).
  hf = models.config_to_hf(models.get_preset("qwen3-4b"))
  hf.update(model_type=family, architectures=None, num_attention_heads=64)
  for field in ("head_dim", "num_key_value_heads", "max_position_embeddings"):
    del hf[field]
  if kv_heads is None:
    hf["num_key_value_heads"] = None
  cls = transformers.CONFIG_MAPPING[family]
  want = cls(**{k: v for k, v in hf.items() if k != "model_type"})
  got = models.config_from_hf(hf)
  head_dim = getattr(want, "head_dim", None) or 2560 // 64
  assert (got.head_dim, got.num_kv_heads, got.max_seq_len) == (
      head_dim,
      want.num_key_value_heads,
      want.max_position_embeddings,
  )


def test_config_reads_transformers4_rope_spelling():
  hf = models.config_to_hf(models.get_preset("llama-3.1-8b"))
  rope = hf.pop("rope_parameters")
  hf["rope_theta"] = rope.pop("rope_theta")
  hf["rope_scaling"] = rope
  assert models.config_from_hf(hf) == models.get_preset("llama-3.1-8b")


@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen2-tiny", "llama-tiny"])
def test_config_to_hf_round_trips_through_transformers(tmp_path, name):
  config = models.get_preset(name)
  (tmp_path / "config.json").write_text(json.dumps(models.config_to_hf(config)))
  hf = transformers.AutoConfig.from_pretrained(tmp_path)
  assert hf.model_type == config.family
  hf.save_pretrained(tmp_path / "again")
  assert models.config_from_hf(tmp_path / "again") == config


@pytest.mark.parametrize(
    "name", ["llama-tiny", "llama-3.1-8b", "qwen3-4b", "qwen2.5-3b"]
)
def test_rope_frequencies_match_transformers(name):
  config = models.get_preset(name)
  rotary = {
      "qwen3": transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding,
      "qwen2": transformers.models.qwen2.modeling_qwen2.Qwen2RotaryEmbedding,
      "llama": transformers.models.llama.modeling_llama.LlamaRotaryEmbedding,
  }[config.family](config=_hf_config(config))
  assert rotary.attention_scaling == 1.0
  np.testing.assert_allclose(
      layers.rope_inv_freq(config), rotary.inv_freq.numpy(), rtol=1e-6
  )


def test_llama3_scaling_hand_computed():
  # Hd = 4, theta = 100: f = (1, 0.1), wavelengths 2 pi and 20 pi.
  # L = 40, low = 1, high = 4: 2 pi < 10 kept; 20 pi > 40 divided by 8.
  config = models.ModelConfig(
      "llama", 16, 8, 1, 2, 1, 4, 8, rope_theta=100.0,
      rope_scaling=models.RopeScaling(8.0, 1.0, 4.0, 40),
  )  # fmt: skip
  np.testing.assert_allclose(
      layers.rope_inv_freq(config), [1.0, 0.1 / 8], rtol=1e-6
  )
  # L = 200: 20 pi is between 50 and 200: s = (200 / (20 pi) - 1) / 3.
  config = config.replace(rope_scaling=models.RopeScaling(8.0, 1.0, 4.0, 200))
  s = (200 / (20 * np.pi) - 1) / 3
  np.testing.assert_allclose(
      layers.rope_inv_freq(config),
      [1.0, (1 - s) * 0.1 / 8 + s * 0.1],
      rtol=1e-6,
  )


def test_presets_are_hashable_and_immutable():
  config = models.get_preset("qwen3-tiny")
  assert hash(config) == hash(models.get_preset("qwen3-tiny"))
  with pytest.raises(AttributeError):
    config.num_layers = 3  # pytype: disable=not-writable


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(family="gpt2"), "family='gpt2'"),
        (dict(num_heads=4, num_kv_heads=3), "not divisible by num_kv_heads=3"),
        (dict(qkv_bias=True), "qkv_bias=True contradicts family 'qwen3'"),
        (dict(qk_norm=False), "qk_norm=False contradicts"),
        (dict(head_dim=15), "head_dim=15 must be even"),
        (dict(vocab_size=0), "vocab_size=0"),
        (dict(rope_theta=-1.0), "rope_theta=-1.0"),
    ],
)
def test_bad_config_names_the_field(changes, message):
  with pytest.raises(models.ConfigError, match=message.replace("(", r"\(")):
    models.get_preset("qwen3-tiny").replace(**changes)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(model_type="gpt2"), "model_type='gpt2' is not supported"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "not divisible"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(attention_bias=True), "attention_bias=true"),
        (dict(use_sliding_window=True), "use_sliding_window"),
        (
            dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6}),
            "rope_type='yarn' is not supported",
        ),
        (dict(vocab_size=None), "vocab_size"),
    ],
)
def test_bad_hf_config_names_file_and_field(tmp_path, changes, message):
  hf = models.config_to_hf(models.get_preset("qwen3-tiny"))
  hf.update(changes)
  hf = {k: v for k, v in hf.items() if v is not None}
  (tmp_path / "config.json").write_text(json.dumps(hf))
  with pytest.raises(models.ConfigError, match=message) as e:
    models.config_from_hf(tmp_path)
  assert str(tmp_path / "config.json") in str(e.value)


def test_missing_config_file(tmp_path):
  with pytest.raises(models.ConfigError, match="no such file"):
    models.config_from_hf(tmp_path)


def test_unknown_preset():
  with pytest.raises(models.ConfigError, match="unknown preset 'qwen9'"):
    models.get_preset("qwen9")
