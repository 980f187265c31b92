"""Prototype: the scoring head taken in vocabulary pieces (online log-sum-exp).

    .venv/bin/python benchmarks/vocab_pieces_prototype.py [--repeats 9]
        [--vocab_chunk_sizes 1024,2048,4096]

Not library code. `scoring._logprobs_fwd` takes each chunk's logits over
the whole vocabulary: it writes a [B, C, V] float32 block and reads it back
for the max, the exp-sum and the target's logit. Here the same forward
takes the vocabulary P pieces at a time (piece i = columns i, i + P, ...,
zero-padded and masked), merging the max and the exp-sum across pieces
online (rescaling the sum when the max moves), so only a [B, C, U] block
is live. Forward only: it is what undifferentiated scoring (the foundation
benchmark's scoring rows, recomputed behaviour log-probs) runs.

Per bench config and dtype, one process, everything compiled first and then
called alternately, medians: (1) the head alone, `token_logprobs_from_hidden`
against this kernel on 32 x 128 rows with a row-major [D, V] head; (2) the
benchmark's scoring call, `scoring.token_logprobs` on the bench model (tied
head, random init) against the same body followed by this kernel. Each
variant's largest |log-prob difference| from the library is printed first.
"""

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

_HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent))

from bench_foundation import _COMMON_HF  # pylint: disable=g-import-not-at-top
from bench_foundation import BENCH_CONFIGS  # pylint: disable=g-import-not-at-top
from bench_update import interleaved_median_ms  # pylint: disable=g-import-not-at-top
from sat_jax import models  # pylint: disable=g-import-not-at-top
from sat_jax import scoring  # pylint: disable=g-import-not-at-top

# pylint: disable=protected-access

_PAD_LOGIT = -1e30  # finite: exp() gives 0, no inf - inf


def pieced_logprobs(h_BxTxD, w_DxV, targets_BxT, pieces, chunk=128):
  """log softmax(h @ w)[y], float32 [B, T], vocabulary in `pieces` pieces."""
  t, d = h_BxTxD.shape[1:]
  v = w_DxV.shape[1]
  u = -(-v // pieces)
  w_DxPU = jnp.pad(w_DxV, ((0, 0), (0, pieces * u - v)))
  w_PxDxU = jnp.transpose(w_DxPU.reshape(d, u, pieces), (2, 0, 1))
  ids_PxU = jnp.arange(u)[None] * pieces + jnp.arange(pieces)[:, None]
  c = min(chunk, t)

  def chunk_fn(h_BxCxD, y_BxC):
    def piece(carry, xs):
      m_BxC, s_BxC, z_y_BxC = carry
      w_DxU, ids_U, i = xs
      z_BxCxU = jnp.einsum(
          "bcd,du->bcu", h_BxCxD, w_DxU, preferred_element_type=jnp.float32
      )
      if pieces * u != v:
        z_BxCxU = jnp.where(ids_U[None, None] < v, z_BxCxU, _PAD_LOGIT)
      m_new_BxC = jnp.maximum(m_BxC, z_BxCxU.max(-1))
      s_BxC = s_BxC * jnp.exp(m_BxC - m_new_BxC) + jnp.exp(
          z_BxCxU - m_new_BxC[..., None]
      ).sum(-1)
      # The target sits in piece y % P, at column y // P.
      z_at_BxC = jnp.take_along_axis(z_BxCxU, (y_BxC // pieces)[..., None], -1)[
          ..., 0
      ]
      z_y_BxC += jnp.where(y_BxC % pieces == i, z_at_BxC, 0.0)
      return (m_new_BxC, s_BxC, z_y_BxC), None

    zeros_BxC = jnp.zeros(y_BxC.shape, jnp.float32)
    init = (zeros_BxC + _PAD_LOGIT, zeros_BxC, zeros_BxC)
    (m_BxC, s_BxC, z_y_BxC), _ = jax.lax.scan(
        piece, init, (w_PxDxU, ids_PxU, jnp.arange(pieces))
    )
    return (z_y_BxC - m_BxC) - jnp.log(s_BxC)

  # The library's chunking along T, so only the head differs.
  xs = (scoring.to_chunks(h_BxTxD, c), scoring.to_chunks(targets_BxT, c))
  return scoring.from_chunks(scoring.map_chunks(chunk_fn, xs), t)


def _model_logprobs(config, params, tokens_BxT, mask_BxT, pieces):
  """`scoring.token_logprobs` (no positions) with the pieced head."""
  h_BxTxD = models.hidden_states(config, params, tokens_BxT, mask_BxT)
  w_DxV = models.unembed_matrix(config, params)
  h_BxTxD, next_BxT = scoring.at_positions(h_BxTxD, tokens_BxT, None)
  logp_BxT = pieced_logprobs(h_BxTxD, w_DxV, next_BxT, pieces)
  return scoring.to_positions(logp_BxT, mask_BxT, None)


def _compare(label, ref_fn, variants, repeats):
  ref = np.asarray(ref_fn())
  diffs = {
      k: float(np.abs(np.asarray(f()) - ref).max()) for k, f in variants.items()
  }
  ms = interleaved_median_ms({"library": ref_fn, **variants}, repeats)
  ms = {k: round(x, 1) for k, x in ms.items()}
  speedup = {k: round(ms["library"] / ms[k], 3) for k in variants}
  print(
      json.dumps(dict(label, ms=ms, x=speedup, max_abs_diff=diffs)), flush=True
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=9)
  parser.add_argument("--vocab_chunk_sizes", default="1024,2048,4096")
  parser.add_argument("--configs", default=",".join(BENCH_CONFIGS))
  parser.add_argument("--dtypes", default="float32,bfloat16")
  ns = parser.parse_args()
  b, t = 32, 128
  for name in ns.configs.split(","):
    hf = dict(BENCH_CONFIGS[name], **_COMMON_HF, model_type="qwen3")
    config = models.config_from_hf(hf)
    v, d = config.vocab_size, hf["hidden_size"]
    piece_counts = sorted(
        {-(-v // int(x)) for x in ns.vocab_chunk_sizes.split(",")}
    )
    for dtype in ns.dtypes.split(","):
      k = jax.random.split(jax.random.key(0), 3)
      h = jax.random.normal(k[0], (b, t, d)).astype(dtype)
      w = (0.05 * jax.random.normal(k[1], (d, v))).astype(dtype)
      y = jax.random.randint(k[2], (b, t), 0, v)
      lib = jax.jit(lambda h, w: scoring.token_logprobs_from_hidden(h, w, y))
      variants = {}
      for p in piece_counts:
        f = jax.jit(lambda h, w, p=p: pieced_logprobs(h, w, y, p))
        variants[f"P={p}"] = lambda f=f: f(h, w)
      label = dict(config=name, dtype=dtype, part="head", rows=b * t)
      _compare(label, lambda: lib(h, w), variants, ns.repeats)

      params = models.init_params(config, k[0], jnp.dtype(dtype))
      tokens = jax.random.randint(k[2], (b, t), 1, v)
      mask = jnp.ones_like(tokens)
      lib = jax.jit(
          lambda p, x, m: scoring.token_logprobs(config, p, x, m, 1.0, 128)
      )
      variants = {}
      for p in piece_counts:
        f = jax.jit(lambda pr, x, m, p=p: _model_logprobs(config, pr, x, m, p))
        variants[f"P={p}"] = lambda f=f: f(params, tokens, mask)
      label = dict(config=name, dtype=dtype, part="scoring call", rows=b * t)
      _compare(label, lambda: lib(params, tokens, mask), variants, ns.repeats)


if __name__ == "__main__":
  main()
