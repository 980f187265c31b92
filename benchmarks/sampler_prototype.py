"""Prototype decode loop for the models engineer: what the sampler could gain.

    .venv/bin/python benchmarks/sampler_prototype.py --ckpt DIR [--dtype ...]

Not library code: a measurement of two changes to `sat_jax.sampling`'s
decode loop, built from `sat_jax.models.layers` so that the arithmetic is the
same, on the bench_foundation workload (batch 32, prompt 64, 64 new tokens,
temperature 1, no filtering, no stop token):

1. `per-layer cache`: each layer's keys and values are their own
   loop-carried [B, K, S, Hd] array, updated in place. `sampling.sample`
   keeps one [L, B, K, S, Hd] stack and slices layer l out of it
   (`dynamic_index_in_dim`) at every step, which XLA's CPU backend turns
   into a copy of that layer's whole cache per step.
2. `inverse_cdf`: the token is drawn by inverting the CDF with one uniform
   per row (exact for the categorical distribution softmax(logp)) instead of
   `jax.random.categorical`, which draws Gumbel noise for all B x V logits.

The categorical variants use `sampling.sample`'s keys, so they reproduce its
tokens up to float-rounding near-ties (the script counts identical rows);
then it times all variants interleaved (median of --repeats after a
warm-up; wall and process CPU time) and prints JSON.
"""

import argparse
import functools
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from sat_jax import models  # pylint: disable=g-import-not-at-top
from sat_jax import sampling  # pylint: disable=g-import-not-at-top
from sat_jax.models import layers  # pylint: disable=g-import-not-at-top


def draw_inverse_cdf(logp_BxV: jax.Array, key: jax.Array) -> jax.Array:
  """token_B with P(token = v) = softmax(logp)_v: u ~ U(0, 1], first c_v >= u.

  c = cumsum(p). Scaling u by c_V absorbs float32 rounding of the sum; u > 0
  means a zero-probability token (c_v == c_{v-1}) is never returned.
  """
  c_BxV = jnp.cumsum(jnp.exp(logp_BxV), axis=-1)
  u_Bx1 = (1.0 - jax.random.uniform(key, c_BxV.shape[:1] + (1,))) * c_BxV[
      :, -1:
  ]
  token_B = jnp.sum(c_BxV < u_Bx1, axis=-1)
  return jnp.minimum(token_B, logp_BxV.shape[-1] - 1).astype(jnp.int32)


def _draw(logits_BxV, key, options, how):
  if how == "categorical":
    return sampling.sample_from_logits(logits_BxV, key, options)
  logp_BxV = sampling.filtered_log_probs(logits_BxV, options)
  token_B = draw_inverse_cdf(logp_BxV, key)
  return token_B, jnp.take_along_axis(logp_BxV, token_B[:, None], 1)[:, 0]


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def generate_per_layer_cache(config, options, how, params, tokens_BxP, key):
  """Full-length decode (no stop tokens, no padding), one cache per layer.

  The layer loop is unrolled over per-layer weights sliced once before the
  loop (as `sampling.sample` does for shallow models), and each layer's
  [B, K, S, Hd] keys and values are their own loop-carried arrays, updated
  in place: nothing is sliced out of an [L, ...] stack inside the loop.
  """
  b, p = tokens_BxP.shape
  n, n_layers = options.max_new_tokens, config.num_layers
  cache = models.init_cache(config, b, p + n, params["embed"].dtype)
  h_BxPxD, cache = models.hidden_states_cached(
      config, params, tokens_BxP, cache
  )
  logits = models.logits_from_hidden(config, params, h_BxPxD[:, -1])
  token, logp = _draw(logits, jax.random.fold_in(key, 0), options, how)
  per_layer = models.unstack_layers(params)["layers"]
  ks = tuple(cache.k_LxBxKxSxHd[i] for i in range(n_layers))
  vs = tuple(cache.v_LxBxKxSxHd[i] for i in range(n_layers))
  w_DxV = models.unembed_matrix(config, params)
  tokens_BxN = jnp.zeros((b, n), jnp.int32).at[:, 0].set(token)
  logprobs_BxN = jnp.zeros((b, n), jnp.float32).at[:, 0].set(logp)
  slot_S = jnp.arange(p + n)

  def body(step, state):
    prev, ks, vs, tokens_BxN, logprobs_BxN = state
    index = p + step - 1  # the slot of `prev`
    cos, sin = layers.rope_tables(config, jnp.full((b, 1), index, jnp.int32))
    allowed_Bx1xS = jnp.broadcast_to(slot_S <= index, (b, 1, p + n))
    x = jnp.take(params["embed"], prev[:, None], axis=0)
    ks, vs = list(ks), list(vs)
    for i, lp in enumerate(per_layer):
      q, k, v = layers.qkv(config, lp, x, cos, sin)
      ks[i] = jax.lax.dynamic_update_slice(
          ks[i], k.astype(ks[i].dtype), (0, 0, index, 0)
      )
      vs[i] = jax.lax.dynamic_update_slice(
          vs[i], v.astype(vs[i].dtype), (0, 0, index, 0)
      )
      attn = layers.attention(q, ks[i], vs[i], allowed_Bx1xS)
      x = layers.attn_out_and_mlp(config, lp, x, attn)
    h_BxD = layers.rms_norm(x, params["final_norm"], config.rms_norm_eps)[:, 0]
    logits = jnp.einsum(
        "bd,dv->bv", h_BxD, w_DxV, preferred_element_type=jnp.float32
    )
    token, logp = _draw(logits, jax.random.fold_in(key, step), options, how)
    tokens_BxN = jax.lax.dynamic_update_slice(
        tokens_BxN, token[:, None], (0, step)
    )
    logprobs_BxN = jax.lax.dynamic_update_slice(
        logprobs_BxN, logp[:, None], (0, step)
    )
    return token, tuple(ks), tuple(vs), tokens_BxN, logprobs_BxN

  state = (token, ks, vs, tokens_BxN, logprobs_BxN)
  _, _, _, tokens_BxN, logprobs_BxN = jax.lax.fori_loop(1, n, body, state)
  return tokens_BxN, logprobs_BxN


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--ckpt", required=True)
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--repeats", type=int, default=5)
  ns = parser.parse_args()
  config, params = models.load_hf(ns.ckpt, dtype=jnp.dtype(ns.dtype))
  b, p, n = 32, 64, 64
  rng = np.random.default_rng(0)
  prompts = jnp.asarray(rng.integers(1, config.vocab_size, (b, p)), jnp.int32)
  mask = jnp.ones_like(prompts)
  opts = sampling.SamplingOptions(max_new_tokens=n)
  key = jax.random.key(0)

  variants = {
      "sampling.sample": (
          lambda: sampling.sample(
              config, params, prompts, mask, opts, key
          ).tokens_BxN
      ),
      "per-layer cache+categorical": lambda: generate_per_layer_cache(
          config, opts, "categorical", params, prompts, key
      )[0],
      "per-layer cache+inverse_cdf": lambda: generate_per_layer_cache(
          config, opts, "inverse_cdf", params, prompts, key
      )[0],
  }
  outs = {
      k: np.asarray(jax.block_until_ready(f())) for k, f in variants.items()
  }
  res = {"ckpt": ns.ckpt, "dtype": ns.dtype}
  ref = outs["sampling.sample"]
  for k, toks in outs.items():
    # Float rounding differs between the variants, so a Gumbel near-tie can
    # flip a token and the row then diverges; most rows stay identical.
    res[f"{k} rows equal to sampling.sample"] = int(
        np.all(toks == ref, axis=1).sum()
    )
  times = {k: [] for k in variants}
  cpu = {k: [] for k in variants}
  for _ in range(ns.repeats):  # interleaved: load drifts hit all variants
    for k, f in variants.items():
      t0, c0 = time.perf_counter(), time.process_time()
      jax.block_until_ready(f())
      times[k].append(time.perf_counter() - t0)
      cpu[k].append(time.process_time() - c0)
  # CPU seconds (all threads) are the steadier measure on a shared machine.
  for k in variants:
    res[f"{k} new tok/s"] = b * n / statistics.median(times[k])
    res[f"{k} cpu ms"] = 1e3 * statistics.median(cpu[k])
  print(json.dumps(res, indent=1))


if __name__ == "__main__":
  main()
