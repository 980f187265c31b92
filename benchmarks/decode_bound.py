"""How fast a decode step can be on this host: a bound for the sampler.

    .venv/bin/python benchmarks/decode_bound.py [--config bench-small]
        [--dtype bfloat16] [--transformers_tok_s 417]

One process, timed interleaved (one call of each per round, medians):
the host's DRAM read bandwidth (a jitted sum over 256 MiB); the decode
step's matmul chain alone, 32 rows through every layer's fused q/k/v, o, fused gate/up and
down projections with the residual adds, SwiGLU and an RMSNorm between them,
then the tied output head, with each layer's own weights (so they stream
from memory as in the sampler) and no attention, RoPE, KV cache or draw, as
a jitted `fori_loop` (XLA) and eagerly in PyTorch (2 threads); and
`sampling.sample` itself with 1 and with 64 new tokens (the first is the
prefill and one draw, their difference / 63 one decode step). Then the
foundation benchmark's matmul roofline (jitted 2048x2048 float32 matmul;
with `--dtype bfloat16` also the bfloat16 one, float32 accumulation).

`--dtype` sets the weights, the rows and the sampler's params: at bfloat16
each JAX product is the model's own (`layers.dot`: bfloat16 operands,
float32 accumulation, rounded back), the norm runs in float32, and the
PyTorch chain runs in bfloat16 (its matmuls accumulate in float32 too).

From these: the sampler's call time if its 63 decode steps cost no more
than the bare XLA chain, and, given transformers' rate from
bench_foundation.py (`--transformers_tok_s`), the largest ratio to it that
this design can reach on this host with XLA's matmuls. `--layouts` also
times each of the chain's matmuls alone in three weight layouts.
"""

import argparse
import json
import operator
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent))

import bench_foundation  # pylint: disable=g-import-not-at-top
from bench_foundation import BENCH_CONFIGS  # pylint: disable=g-import-not-at-top
from bench_foundation import model_flops  # pylint: disable=g-import-not-at-top
from bench_foundation import WORKLOAD  # pylint: disable=g-import-not-at-top
from foundation_workers import roofline  # pylint: disable=g-import-not-at-top
from foundation_workers import timed_interleaved  # pylint: disable=g-import-not-at-top
import host_info  # pylint: disable=g-import-not-at-top
from sat_jax import host_memory  # pylint: disable=g-import-not-at-top
from sat_jax import models  # pylint: disable=g-import-not-at-top
from sat_jax import sampling  # pylint: disable=g-import-not-at-top


def chain_weights(hf: dict, key: jax.Array, dtype=jnp.float32) -> dict:
  """Per-layer stacked weights of the decode step's projections."""
  d, f, v = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
  layers, hd = hf["num_hidden_layers"], hf["head_dim"]
  q, kv = hf["num_attention_heads"] * hd, hf["num_key_value_heads"] * hd
  shapes = {
      "qkv_LxDxQ": (layers, d, q + 2 * kv),
      "o_LxQxD": (layers, q, d),
      "gate_up_LxDx2F": (layers, d, 2 * f),
      "down_LxFxD": (layers, f, d),
      "embed_VxD": (v, d),
  }
  keys = jax.random.split(key, len(shapes))
  return {
      name: (0.02 * jax.random.normal(k, shape, jnp.float32)).astype(dtype)
      for k, (name, shape) in zip(keys, shapes.items())
  }


def chain_step(w: dict, x_BxD, silu, rms_norm, matmul=operator.matmul):
  """One decode step's projections on rows `x_BxD`.

  `silu`, `rms_norm` and `matmul` come from the caller, so the same code
  runs in JAX and in PyTorch, at either precision. Returns the next rows
  (fed from the logits so that the steps depend on each other, as decode
  steps do).
  """
  q = w["o_LxQxD"].shape[1]
  f = w["down_LxFxD"].shape[1]
  for layer in range(w["qkv_LxDxQ"].shape[0]):
    qkv = matmul(x_BxD, w["qkv_LxDxQ"][layer])
    x_BxD = x_BxD + matmul(qkv[:, :q], w["o_LxQxD"][layer])
    gate_up = matmul(x_BxD, w["gate_up_LxDx2F"][layer])
    x_BxD = x_BxD + matmul(
        silu(gate_up[:, :f]) * gate_up[:, f:], w["down_LxFxD"][layer]
    )
    x_BxD = rms_norm(x_BxD)
  logits_BxV = matmul(x_BxD, w["embed_VxD"].T)
  return x_BxD + 1e-3 * logits_BxV[:, : x_BxD.shape[1]]


def chain_flops(hf: dict, rows: int) -> int:
  """Matmul FLOPs of one step of the chain (no attention: ctx_sum 0)."""
  return model_flops(hf, rows, rows, 0)


def sampler_bound(
    prefill_s: float, chain_step_s: float, rows: int, new_tokens: int
) -> float:
  """New tokens/s of a call whose decode steps cost only the chain."""
  return rows * new_tokens / (prefill_s + (new_tokens - 1) * chain_step_s)


def _jax_rms_norm(x_BxD):
  xf = x_BxD.astype(jnp.float32)
  rstd = jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)
  return (xf * rstd).astype(x_BxD.dtype)


def _jax_matmul(a, b):
  """The model's product (`layers.dot`): float32 accumulation, rounded back."""
  return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _torch_chain(w_np: dict, x_np, steps: int, threads: int):
  import torch  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(threads)
  dtype = getattr(torch, str(np.asarray(x_np).dtype))

  def to_torch(a):  # through float32: torch reads no NumPy bfloat16
    return torch.from_numpy(np.asarray(a, np.float32)).to(dtype)

  w = {k: to_torch(a) for k, a in w_np.items()}
  x0 = to_torch(x_np)

  def rms_norm(x_BxD):
    xf = x_BxD.float()
    rstd = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-6)
    return (xf * rstd).to(dtype)

  def run():
    with torch.inference_mode():
      x = x0
      for _ in range(steps):
        x = chain_step(w, x, torch.nn.functional.silu, rms_norm)
    return x

  return run


def layout_rates(w: dict, rows: int, steps: int, repeats: int) -> dict:
  """GFLOP/s of each chain matmul alone, in three weight layouts.

  `x W` with W stored [K, N] (as the model stores it), `x W^T` with W stored
  [N, K] (a `dot_general` contracting both minor dims), and `(W x^T)^T`.
  Each shape runs `steps` times in a jitted loop over its layers' copies
  (the head's one), each result feeding the next input so the calls chain.
  """
  rates = {}
  for name, w_RxKxN in w.items():
    if name == "embed_VxD":
      w_RxKxN = w_RxKxN.T[None]
    copies, k, n = w_RxKxN.shape
    w_RxNxK = jnp.swapaxes(w_RxKxN, 1, 2).copy()
    dtype = w_RxKxN.dtype
    x_BxK = jax.random.normal(jax.random.PRNGKey(0), (rows, k), dtype)
    f32 = jnp.float32
    # Each layout's product (float32 accumulation) and its stored weights.
    products = {
        "x W [K,N]": (
            lambda w, x: jnp.matmul(x, w, preferred_element_type=f32),
            w_RxKxN,
        ),
        "x W^T [N,K]": (
            lambda w, x: jax.lax.dot_general(
                x, w, (((1,), (1,)), ((), ())), preferred_element_type=f32
            ),
            w_RxNxK,
        ),
        "(W x^T)^T [N,K]": (
            lambda w, x: jnp.matmul(w, x.T, preferred_element_type=f32).T,
            w_RxNxK,
        ),
    }

    def loop(product):
      def run(w_stack, x_BxK):
        def body(i, acc_BxN):
          x = (x_BxK + 1e-9 * acc_BxN[:, :1]).astype(dtype)
          return acc_BxN + product(w_stack[i % copies], x)

        return jax.lax.fori_loop(0, steps, body, jnp.zeros((rows, n)))

      # Arguments, not closed-over constants: XLA would fold those in.
      return jax.jit(run)

    fns = [
        lambda f=loop(product), w=w_stack: f(w, x_BxK).block_until_ready()
        for product, w_stack in products.values()
    ]
    times = timed_interleaved(fns, repeats)
    flops = 2 * rows * k * n * steps
    rates[f"{name} [{rows},{k}]x[{k},{n}]"] = {
        layout: flops / t["median_s"] / 1e9
        for layout, t in zip(products, times)
    }
  return rates


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="bench-small", choices=BENCH_CONFIGS)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--threads", type=int, default=2, help="torch threads")
  parser.add_argument(
      "--dtype", default="float32", choices=("float32", "bfloat16")
  )
  parser.add_argument(
      "--transformers_tok_s",
      type=float,
      default=None,
      help="transformers' new tokens/s on the same workload (bench_foundation)",
  )
  parser.add_argument(
      "--layouts",
      action="store_true",
      help="also time each chain matmul alone in three weight layouts",
  )
  ns = parser.parse_args()
  host_memory.reuse_freed_pages()
  # The foundation benchmark's config (rope, tied head), as a Qwen3.
  hf = dict(bench_foundation._hf_config(ns.config), model_type="qwen3")  # pylint: disable=protected-access
  rows, prompt_len = WORKLOAD["batch"], WORKLOAD["prompt_len"]
  new_tokens = WORKLOAD["new_tokens"]
  key = jax.random.PRNGKey(0)

  big = jnp.ones((64 * 2**20,), jnp.float32)
  dram_sum = jax.jit(jnp.sum)

  dtype = jnp.dtype(ns.dtype)
  w = chain_weights(hf, key, dtype)
  x0 = jax.random.normal(key, (rows, hf["hidden_size"]), dtype)
  steps = new_tokens - 1

  def xla_step(w, x):
    return chain_step(w, x, jax.nn.silu, _jax_rms_norm, _jax_matmul)

  xla_chain = jax.jit(
      lambda w, x: jax.lax.fori_loop(0, steps, lambda _, x: xla_step(w, x), x)
  )
  torch_chain = _torch_chain(w, x0, steps, ns.threads)

  config = models.config_from_hf(hf)
  params = models.init_params(config, jax.random.PRNGKey(1), dtype)
  prompts = jax.random.randint(
      key, (rows, prompt_len), 1, hf["vocab_size"], jnp.int32
  )
  mask = jnp.ones_like(prompts)

  def sample(n):
    options = sampling.SamplingOptions(
        max_new_tokens=n, temperature=1.0, top_p=1.0, top_k=0,
        stop_token_ids=(),
    )  # fmt: skip
    return lambda: jax.block_until_ready(
        sampling.sample(config, params, prompts, mask, options, key)
    )

  names = ("dram_sum", "xla_chain", "torch_chain", "sample_1",
           f"sample_{new_tokens}")  # fmt: skip
  fns = (
      lambda: dram_sum(big).block_until_ready(),
      lambda: xla_chain(w, x0).block_until_ready(),
      torch_chain,
      sample(1),
      sample(new_tokens),
  )
  t = dict(
      zip(names, (r["median_s"] for r in timed_interleaved(fns, ns.repeats)))
  )

  flops = chain_flops(hf, rows)
  peaks = roofline({"repeats": ns.repeats})
  dtype_peak = (peaks["bfloat16"] if ns.dtype == "bfloat16" else peaks)[
      "flop_per_s"
  ]
  weight_bytes = sum(a.nbytes for a in w.values())
  prefill_s = t["sample_1"]
  step_s = {
      "sampler": (t[f"sample_{new_tokens}"] - prefill_s) / steps,
      "xla_chain": t["xla_chain"] / steps,
      "torch_chain": t["torch_chain"] / steps,
  }
  result = {
      "machine": host_info.describe(),
      "config": ns.config,
      "dtype": ns.dtype,
      "dram_read_gb_s": big.nbytes / t["dram_sum"] / 1e9,
      "roofline_gflop_s": peaks["flop_per_s"] / 1e9,
      "bfloat16_roofline_gflop_s": peaks["bfloat16"]["flop_per_s"] / 1e9,
      "chain_weights_mb": weight_bytes / 1e6,
      "chain_gflop_per_step": flops / 1e9,
      "weights_streaming_floor_ms": (
          weight_bytes / (big.nbytes / t["dram_sum"]) * 1e3
      ),
      "step_ms": {k: v * 1e3 for k, v in step_s.items()},
      "step_gflop_s": {k: flops / v / 1e9 for k, v in step_s.items()},
      # The same rates as a share of the matmul roofline of the run's dtype.
      "step_pct_of_dtype_roofline": {
          k: 100 * flops / v / dtype_peak for k, v in step_s.items()
      },
      "sampler_prefill_s": prefill_s,
      "sampler_new_tok_s": rows * new_tokens / t[f"sample_{new_tokens}"],
      "bound_new_tok_s": sampler_bound(
          prefill_s, step_s["xla_chain"], rows, new_tokens
      ),
  }
  if ns.transformers_tok_s:
    result["transformers_new_tok_s"] = ns.transformers_tok_s
    result["sampler_x_transformers"] = (
        result["sampler_new_tok_s"] / ns.transformers_tok_s
    )
    result["bound_x_transformers"] = (
        result["bound_new_tok_s"] / ns.transformers_tok_s
    )
  if ns.layouts:
    result["layout_gflop_s"] = layout_rates(w, rows, steps, ns.repeats)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
