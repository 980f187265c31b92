"""Logits parity with the transformers PyTorch models, for every family.

A tiny random transformers model is saved with `save_pretrained`, loaded by
`models.load_hf`, and both run the same tokens. For padded batches
transformers gets explicit position_ids equal to ours (cumsum(mask) - 1),
and only real positions are compared (transformers' outputs at padding
positions are arbitrary).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from sat_jax import models
from sat_jax import testing

_forward = jax.jit(models.forward, static_argnums=0)
# Tied and untied embeddings, qkv bias (qwen2), q/k norm (qwen3), llama3 RoPE
# scaling; each case shaped like a real preset (Qwen3-0.6B and -8B,
# Qwen2.5-3B, Llama-3.1-8B).
_CASES = [("qwen3", True), ("qwen3", False), ("qwen2", True), ("llama", False)]


@functools.lru_cache(maxsize=None)
def _checkpoint(tmp_root, family, tie):
  path = testing.save_tiny_hf_model(
      f"{tmp_root}/{family}-{tie}", family, tie=tie, seed=3
  )
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  return path, torch_model


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("parity"))


def _batch():
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, testing.TINY_VOCAB, (4, 12))
  mask = np.ones((4, 12), np.int64)
  mask[1, :4] = 0  # left padding
  mask[2, -3:] = 0  # right padding
  mask[3, :2] = 0
  mask[3, -2:] = 0  # both
  return tokens, mask


def _torch_logits(model, tokens, mask=None, positions=None):
  kwargs = {}
  if mask is not None:
    kwargs = dict(
        attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions)
    )
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens), **kwargs).logits.numpy()


@pytest.mark.parametrize("family, tie", _CASES)
def test_logits_match_transformers(tmp_root, family, tie):
  path, torch_model = _checkpoint(tmp_root, family, tie)
  config, params = models.load_hf(path)
  assert config == testing.tiny_config(family, tie_embeddings=tie)
  tokens, mask = _batch()

  ref = _torch_logits(torch_model, tokens)
  ours = _forward(config, params, tokens, np.ones_like(mask))
  assert np.abs(ref).max() > 0.5  # not a trivially flat model
  np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)

  positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
  ref = _torch_logits(torch_model, tokens, mask, positions)
  ours = np.asarray(_forward(config, params, tokens, mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], ref[real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("family, tie", [("qwen3", True), ("llama", False)])
def test_hidden_states_times_unembed_is_forward(tmp_root, family, tie):
  path, _ = _checkpoint(tmp_root, family, tie)
  config, params = models.load_hf(path)
  tokens, mask = _batch()
  h = jax.jit(models.hidden_states, static_argnums=0)(
      config, params, tokens, mask
  )
  w = models.unembed_matrix(config, params)
  assert w.shape == (config.hidden_size, config.vocab_size)
  np.testing.assert_allclose(
      h @ w, _forward(config, params, tokens, mask), atol=1e-5
  )


def test_bfloat16_logits_gap(tmp_root):
  """bf16 params compute in bf16 with f32 norms/softmax; logits stay close."""
  path, torch_model = _checkpoint(tmp_root, "qwen3", True)
  config, params32 = models.load_hf(path)
  _, params16 = models.load_hf(path, dtype=jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params16))
  tokens, mask = _batch()
  l32 = _forward(config, params32, tokens, mask)
  l16 = _forward(config, params16, tokens, mask)
  assert l16.dtype == jnp.float32
  real = mask.astype(bool)
  gap = float(jnp.max(jnp.abs(l16 - l32)[real]))
  scale = float(jnp.max(jnp.abs(l32)[real]))
  # Measured (this model, seed 3): max gap 0.024, mean 0.003, for logits up
  # to 1.95; bf16 keeps 8 mantissa bits.
  assert 0 < gap < 0.05 * scale
  # Same top-1 tokens almost everywhere.
  agree = jnp.mean((jnp.argmax(l16, -1) == jnp.argmax(l32, -1))[real])
  assert agree > 0.9
