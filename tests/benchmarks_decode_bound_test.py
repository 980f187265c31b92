"""benchmarks/decode_bound.py: the decode-step bound's FLOPs, chain and formula."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks")
)

import decode_bound  # pylint: disable=g-import-not-at-top,wrong-import-position

# D 4, F 6, V 10, 2 layers, 2 heads, 1 kv head, head_dim 2.
_HF = dict(vocab_size=10, hidden_size=4, num_hidden_layers=2,
           num_attention_heads=2, num_key_value_heads=1, head_dim=2,
           intermediate_size=6)  # fmt: skip


def test_chain_flops_by_hand():
  # Per layer: q 4x4 + k, v 4x2 each + o 4x4 + gate/up/down 3 x 4x6 = 120
  # weights; 2 layers = 240. 3 rows: 2 x 240 x 3 + head 2 x 4 x 10 x 3.
  assert decode_bound.chain_flops(_HF, rows=3) == 1440 + 240


def test_chain_weights_match_the_flop_count():
  w = decode_bound.chain_weights(_HF, jax.random.PRNGKey(0))
  assert w["qkv_LxDxQ"].shape == (2, 4, 4 + 2 * 2)
  assert w["embed_VxD"].shape == (10, 4)
  elements = sum(a.size for a in w.values())
  assert decode_bound.chain_flops(_HF, rows=5) == 2 * 5 * elements


def _numpy_chain_step(w, x):
  """One chain step written out for the test: 2 layers, q 4, F 6, D 4."""
  silu = lambda z: z / (1.0 + np.exp(-z))
  for layer in range(2):
    qkv = x @ w["qkv_LxDxQ"][layer]
    x = x + qkv[:, :4] @ w["o_LxQxD"][layer]
    gate_up = x @ w["gate_up_LxDx2F"][layer]
    x = x + (silu(gate_up[:, :6]) * gate_up[:, 6:]) @ w["down_LxFxD"][layer]
    x = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6)
  return x + 1e-3 * (x @ w["embed_VxD"].T)[:, :4]


def test_chain_step_against_numpy_and_torch():
  pytest.importorskip("torch")
  w = decode_bound.chain_weights(_HF, jax.random.PRNGKey(1))
  w = {k: np.asarray(10.0 * v, np.float64) for k, v in w.items()}
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (3, 4)), np.float64)
  want = _numpy_chain_step(w, x)
  w32 = {k: v.astype(np.float32) for k, v in w.items()}
  x32 = x.astype(np.float32)
  got_jax = decode_bound.chain_step(
      w32, x32, jax.nn.silu, decode_bound._jax_rms_norm  # pylint: disable=protected-access
  )
  run_torch = decode_bound._torch_chain(w32, x32, steps=2, threads=1)  # pylint: disable=protected-access
  np.testing.assert_allclose(np.asarray(got_jax), want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
      run_torch().numpy(), _numpy_chain_step(w, want), rtol=1e-4, atol=1e-5
  )


def test_chain_step_in_bfloat16_against_numpy_and_torch():
  # --dtype bfloat16: the model's product (bfloat16 operands, float32
  # accumulation) and a float32 norm keep the chain near the float64 one;
  # bfloat16 keeps 8 significant bits: 2 layers stay within 1e-2 (4.6e-3).
  torch = pytest.importorskip("torch")
  w = decode_bound.chain_weights(_HF, jax.random.PRNGKey(1))
  w = {k: np.asarray(10.0 * v, np.float64) for k, v in w.items()}
  x = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (3, 4)), np.float64)
  want = _numpy_chain_step(w, x)
  w16 = {k: jnp.asarray(v, jnp.bfloat16) for k, v in w.items()}
  x16 = jnp.asarray(x, jnp.bfloat16)
  rms_norm = decode_bound._jax_rms_norm  # pylint: disable=protected-access
  matmul = decode_bound._jax_matmul  # pylint: disable=protected-access
  got_jax = decode_bound.chain_step(w16, x16, jax.nn.silu, rms_norm, matmul)
  assert got_jax.dtype == jnp.bfloat16
  got_torch = decode_bound._torch_chain(w16, x16, steps=1, threads=1)()  # pylint: disable=protected-access
  assert got_torch.dtype == torch.bfloat16
  for got in (np.asarray(got_jax, np.float64), got_torch.double().numpy()):
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def test_sampler_bound_by_hand():
  # 32 rows x 64 tokens over a 0.5 s prefill and 63 steps of 20 ms.
  got = decode_bound.sampler_bound(0.5, 0.02, rows=32, new_tokens=64)
  assert got == pytest.approx(2048 / 1.76)
