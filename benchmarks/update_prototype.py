"""Prototype for the GRPO step's update: what reusing the rollout saves.

    .venv/bin/python benchmarks/update_prototype.py [--repeats 11]

Not library code. In an on-policy step the update's forward pass runs at
the behaviour parameters over the tokens the sampler has just produced, so
every projection matmul of that pass (q, k, v, o, gate, up, down) repeats
one the sampler already did. This measures what the gradient costs when
those outputs are supplied: a `custom_vjp` matmul whose forward returns a
given output and whose backward is the usual (g w^T, x^T g), inside an
otherwise ordinary autodiff of a Qwen3-shaped body (bench-tiny: 4 layers,
D 256, 8 query / 4 kv heads of 32, SwiGLU 768, V 4096, tied head) on the
GRPO step's 32 x 80 view with the loss at the last 64 positions. Norms,
RoPE, the attention's own two small matmuls, the softmax and the head are
recomputed as usual. The outputs here come from this script's own forward
(in the library they would be written by the decode loop), so the two
gradients must agree to float32 rounding; the script prints their largest
difference, the medians of both (compiled in one process, called
alternately) and their ratio.

The model is written here, standalone (plain autodiff, no hand-written
SwiGLU backward, no chunked head), so expect less on the library's update.
The second measurement is on the library itself: `objective.update_agent`
as the GRPO step runs it (bench_update.py's "grpo" workload: 32 x 80, one
AdamW step, no KL), compiled twice in one process, once as it is and once
with the forward projections made free (`layers.dot` and the SwiGLU
block's forward swapped, at trace time, for versions whose forward
returns a cheap stand-in of the right shape and whose backward is the true
one). The stand-in's values are meaningless; only the time counts: it is
the most the update could gain from outputs supplied by the rollout.
"""

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from sat_jax import host_memory  # pylint: disable=g-import-not-at-top
import bench_update  # pylint: disable=g-import-not-at-top,wrong-import-position

L, D, H, K, HD, F, V = 4, 256, 8, 4, 32, 768, 4096
B, T, A = 32, 80, 64


def init(key):
  keys = iter(jax.random.split(key, 64))

  def normal(*shape):
    return jax.random.normal(next(keys), shape) * 0.05

  layer = lambda: dict(
      attn_norm=jnp.ones(D), q=normal(D, H * HD), k=normal(D, K * HD),
      v=normal(D, K * HD), o=normal(H * HD, D), q_norm=jnp.ones(HD),
      k_norm=jnp.ones(HD), mlp_norm=jnp.ones(D), gate=normal(D, F),
      up=normal(D, F), down=normal(F, D),
  )  # fmt: skip
  params = {"embed": normal(V, D), "final_norm": jnp.ones(D)}
  params["layers"] = [layer() for _ in range(L)]
  tokens_BxT = jax.random.randint(next(keys), (B, T), 0, V)
  adv_Bx1 = jax.random.normal(next(keys), (B, 1))
  return params, tokens_BxT, adv_Bx1


def rms_norm(x, scale):
  return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def rope(x_BxTxNxHd):
  inv = 1.0 / (1e6 ** (jnp.arange(0, HD, 2) / HD))
  angle_TxHd2 = jnp.arange(T)[:, None] * inv[None]
  c, s = (
      jnp.cos(angle_TxHd2)[None, :, None],
      jnp.sin(angle_TxHd2)[None, :, None],
  )
  x1, x2 = jnp.split(x_BxTxNxHd, 2, -1)
  return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def loss_and_outputs(params, tokens_BxT, adv_Bx1, dot, given):
  """GRPO-shaped loss; `dot(x, w, y_given)` makes every projection."""
  outputs, given = [], iter(given) if given is not None else None

  def project(x, w):
    y = dot(x, w, next(given) if given else None)
    outputs.append(y)
    return y

  causal_TxT = jnp.tril(jnp.ones((T, T), bool))
  x = params["embed"][tokens_BxT]
  for lp in params["layers"]:
    h = rms_norm(x, lp["attn_norm"])
    q = project(h, lp["q"]).reshape(B, T, H, HD)
    k = project(h, lp["k"]).reshape(B, T, K, HD)
    v = project(h, lp["v"]).reshape(B, T, K, HD)
    q = rope(rms_norm(q, lp["q_norm"])).reshape(B, T, K, H // K, HD)
    k = rope(rms_norm(k, lp["k_norm"]))
    scores = jnp.einsum("btkgh,bskh->bkgts", q, k) * HD**-0.5
    probs = jax.nn.softmax(jnp.where(causal_TxT, scores, -1e30), -1)
    attn = jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(B, T, H * HD)
    x = x + project(attn, lp["o"])
    h = rms_norm(x, lp["mlp_norm"])
    act = jax.nn.silu(project(h, lp["gate"])) * project(h, lp["up"])
    x = x + project(act, lp["down"])
  h_BxAxD = rms_norm(x[:, T - A :], params["final_norm"])
  logp_BxAxV = jax.nn.log_softmax(h_BxAxD @ params["embed"].T)
  targets_BxA = tokens_BxT[:, T - A :]
  logp = jnp.take_along_axis(logp_BxAxV, targets_BxA[..., None], -1)[..., 0]
  return -jnp.mean(adv_Bx1 * logp), outputs


def matmul(x, w, _):
  return x @ w


@jax.custom_vjp
def given_matmul(x, w, y):
  del x, w
  return y


def _given_fwd(x, w, y):
  return y, (x, w)


def _given_bwd(res, g):
  x, w = res
  return g @ w.T, jnp.einsum("...i,...j->ij", x, g), None


given_matmul.defvjp(_given_fwd, _given_bwd)


def library_update_times(repeats: int) -> dict[str, float]:
  """Median ms of update_agent as is and with its forward projections free."""
  import functools  # pylint: disable=g-import-not-at-top

  from sat_jax.core import agent as agent_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.core import batch as batch_lib  # pylint: disable=g-import-not-at-top
  from sat_jax.core import config as core_config  # pylint: disable=g-import-not-at-top
  from sat_jax.core import objective  # pylint: disable=g-import-not-at-top
  from sat_jax.models import layers  # pylint: disable=g-import-not-at-top
  from sat_jax.models import presets  # pylint: disable=g-import-not-at-top
  from sat_jax.models import transformer  # pylint: disable=g-import-not-at-top
  from sat_jax.team import lm_agent  # pylint: disable=g-import-not-at-top

  config = presets.get_preset("qwen3-bench-small")
  params = transformer.init_params(config, jax.random.key(0))
  inputs, own_ExT, positions = bench_update._view(  # pylint: disable=protected-access
      config, 32, 80, 64, jax.random.key(1)
  )
  agent = lm_agent.LMAgent(config, 1.0)
  view = batch_lib.AgentView(
      inputs=dict(inputs, positions_ExA=jnp.asarray(positions)),
      mask_ExT=jnp.asarray(own_ExT),
      behaviour_logp_ExT=jax.jit(agent.token_logprobs)(params, inputs),
  )
  cfg = core_config.UpdateConfig(
      ratio_mode="token",
      epochs=1,
      minibatches=1,
      optimizer=core_config.OptimizerConfig(learning_rate=1e-4),
  )
  opt_state = agent_lib.make_optimizer(cfg.optimizer).init(params)
  args = (
      params, opt_state, params, jnp.float32(0.0), jnp.float32(1.0),
      jnp.float32(jnp.inf), view, jax.random.normal(jax.random.key(2), (32,)),
      jnp.ones(32), jax.random.key(3),
  )  # fmt: skip

  def stand_in(spec, x, w, dtype):
    shape = jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), x, w).shape
    s = jnp.mean(x.astype(jnp.float32)) + jnp.mean(w.astype(jnp.float32))
    return jnp.broadcast_to(s, shape).astype(dtype)

  real_dot, real_swiglu_forward = layers.dot, layers._swiglu_forward  # pylint: disable=protected-access

  @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
  def free_dot(spec, x, w):
    return stand_in(spec, x, w, x.dtype)

  def free_dot_bwd(spec, res, g):
    return jax.vjp(lambda a, b: real_dot(spec, a, b), *res)[1](g)

  free_dot.defvjp(
      lambda spec, x, w: (free_dot(spec, x, w), (x, w)), free_dot_bwd
  )

  def free_swiglu_forward(x, scale, w_gate, w_up, w_down, eps):
    h = layers.rms_norm(x, scale, eps)
    gate = stand_in("btd,df->btf", h, w_gate, jnp.float32)
    up = stand_in("btd,df->btf", h, w_up, jnp.float32)
    return layers._swiglu_out(x, gate, up, w_down), (gate, up)  # pylint: disable=protected-access

  def compiled():
    fn = jax.jit(
        lambda *a: objective.update_agent.__wrapped__(
            agent, cfg, *a, kl_penalty=False, monitor=False, measure_new=False
        )
    )
    return fn.lower(*args).compile()

  executables = {"as is": compiled()}
  layers.dot, layers._swiglu_forward = free_dot, free_swiglu_forward  # pylint: disable=protected-access
  try:
    executables["forward projections free"] = compiled()
  finally:
    layers.dot, layers._swiglu_forward = real_dot, real_swiglu_forward  # pylint: disable=protected-access
  calls = {k: functools.partial(c, *args) for k, c in executables.items()}
  return bench_update.interleaved_median_ms(calls, repeats)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=11)
  ns = parser.parse_args()
  host_memory.reuse_freed_pages()
  params, tokens, adv = init(jax.random.PRNGKey(0))

  def loss(dot, p, given):
    return loss_and_outputs(p, tokens, adv, dot, given)[0]

  grad_plain = jax.jit(lambda p: jax.grad(lambda q: loss(matmul, q, None))(p))
  grad_given = jax.jit(
      lambda p, y: jax.grad(lambda q: loss(given_matmul, q, y))(p)
  )
  given = jax.jit(lambda p: loss_and_outputs(p, tokens, adv, matmul, None)[1])(
      params
  )
  g_plain, g_given = grad_plain(params), grad_given(params, given)
  diff = max(
      float(jnp.max(jnp.abs(a - b)))
      for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_given))
  )
  scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g_plain))
  calls = {
      "autodiff": lambda: grad_plain(params),
      "outputs given": lambda: grad_given(params, given),
  }
  ms = bench_update.interleaved_median_ms(calls, ns.repeats)
  mib = sum(y.size * y.dtype.itemsize for y in given) / 2**20
  print(
      f"gradient, {B} x {T} (loss at {A}): autodiff {ms['autodiff']:.1f} ms,"
      f" projection outputs given {ms['outputs given']:.1f} ms,"
      f" {ms['autodiff'] / ms['outputs given']:.2f}x; largest gradient"
      f" difference {diff:.1e} (largest entry {scale:.1e}); outputs kept"
      f" {mib:.0f} MiB"
  )
  lib = library_update_times(ns.repeats)
  print(
      "objective.update_agent, GRPO step (32 x 80, one AdamW step): as is"
      f" {lib['as is']:.1f} ms, forward projections free"
      f" {lib['forward projections free']:.1f} ms,"
      f" {lib['as is'] / lib['forward projections free']:.2f}x"
  )


if __name__ == "__main__":
  main()
