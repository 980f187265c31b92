"""The model gradient with the hand-written SwiGLU backward vs plain autodiff.

    .venv/bin/python benchmarks/bench_model_grad.py [--repeats 11]

Times jax.grad of sum(scoring.token_logprobs) over a 32 x 80 batch (the
GRPO benchmark's shape) for the two sampler benchmark architectures, in
float32 and bfloat16, with `layers.swiglu_residual` as shipped and with the
same block written plainly and differentiated by JAX (the comparison of
tests/models_swiglu_test.py). Both variants are compiled in this process
and timed interleaved (medians), so machine load moves both alike. Prints
a markdown table: median ms of each and the speedup, plus the largest
gradient difference relative to the largest gradient entry.
"""

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from sat_jax import models  # pylint: disable=g-import-not-at-top
from sat_jax import scoring  # pylint: disable=g-import-not-at-top
from sat_jax.models import layers  # pylint: disable=g-import-not-at-top
from sat_jax.models import presets  # pylint: disable=g-import-not-at-top

CONFIGS = {
    "bench-tiny": "qwen3-bench-small",
    "bench-small": "qwen3-bench-medium",
}


def plain_block(x, scale, w_gate, w_up, w_down, eps):
  """The same block with layers.py's ops, left to autodiff."""
  h = layers.rms_norm(x, scale, eps)
  gate = jnp.einsum(
      "btd,df->btf", h, w_gate, preferred_element_type=jnp.float32
  )
  up = jnp.einsum("btd,df->btf", h, w_up, preferred_element_type=jnp.float32)
  return x + layers.dot(
      "btf,fd->btd", (jax.nn.silu(gate) * up).astype(h.dtype), w_down
  )


def compiled_grads(config, params, tokens, mask):
  def loss(p):
    return jnp.sum(scoring.token_logprobs(config, p, tokens, mask))

  shipped = layers.swiglu_residual
  out = {"hand-written": jax.jit(jax.grad(loss)).lower(params).compile()}
  layers.swiglu_residual = plain_block
  try:
    out["autodiff"] = jax.jit(jax.grad(loss)).lower(params).compile()
  finally:
    layers.swiglu_residual = shipped
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=11)
  parser.add_argument("--batch", type=int, default=32)
  parser.add_argument("--length", type=int, default=80)
  ns = parser.parse_args()
  print(
      f"grad of sum(token_logprobs), {ns.batch} x {ns.length}, median of"
      f" {ns.repeats} interleaved calls\n"
  )
  print(
      "| config | dtype | autodiff ms | hand-written ms | speedup | max rel"
      " diff |"
  )
  print("| --- | --- | ---: | ---: | ---: | ---: |")
  for name, preset in CONFIGS.items():
    config = presets.get_preset(preset)
    for dtype in (jnp.float32, jnp.bfloat16):
      params = models.init_params(config, jax.random.key(0), dtype)
      tokens = jax.random.randint(
          jax.random.key(1), (ns.batch, ns.length), 0, config.vocab_size
      )
      mask = jnp.ones_like(tokens)
      fns = compiled_grads(config, params, tokens, mask)
      grads = {k: f(params) for k, f in fns.items()}
      diff = max(
          float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
          / max(float(jnp.max(jnp.abs(b.astype(jnp.float32)))), 1e-30)
          for a, b in zip(
              jax.tree.leaves(grads["hand-written"]),
              jax.tree.leaves(grads["autodiff"]),
          )
      )
      times = {k: [] for k in fns}
      for _ in range(ns.repeats):
        for k, f in fns.items():
          start = time.perf_counter()
          jax.block_until_ready(f(params))
          times[k].append(time.perf_counter() - start)
      ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
      print(
          f"| {name} | {jnp.dtype(dtype).name} | {ms['autodiff']:.0f} |"
          f" {ms['hand-written']:.0f} |"
          f" {ms['autodiff'] / ms['hand-written']:.2f}x | {diff:.1e} |"
      )


if __name__ == "__main__":
  main()
