"""The per-agent objective and its jitted update (epochs x minibatches).

For agent j = sigma(i), with its own positions T_j(tau), the stage-start
behaviour log-probs log pi_j^beh and the advantage A(tau) and truncated weight
c(tau) of advantage.py:

  u_j(tau) = sum_{t in T_j(tau)} log pi_j(a_t|s_t) - log pi_j^beh(a_t|s_t)
  ratio modes:  seq       r(tau) = exp(u_j(tau))                (the paper)
                seq_mean  r(tau) = exp(u_j(tau) / |T_j(tau)|)   (GSPO-like)
                token     r_t    = exp(log-ratio at t)          (PPO)
  surrogate     s = min(r A, clip(r, 1 - eps, 1 + eps_high) A)
  L_j = sum_tau c(tau) s(tau) / #episodes where j acts    (seq, seq_mean)
        sum_tau c(tau) sum_t s_t / #positions where j acts (token)
  loss = -L_j + beta_j * mean_{s in S_j} KL(pi_j(.|s) || pi_j^cur(.|s))

where S_j are j's states in the (mini)batch and pi_j^cur is j's stage-start
policy (its params when the update starts). The KL is the agent's exact
`state_kl`, called inside the loss so that the penalty is differentiated.
Positions where j does not act are excluded with `where`, never multiplied
by a mask, so a non-finite value there cannot leak into the loss.
"""

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from sat_jax.core import agent as agent_lib
from sat_jax.core import batch as batch_lib
from sat_jax.core import config as config_lib
from sat_jax.core import tracing

PyTree = Any
Metrics = dict[str, jax.Array]


def _clipped(r, adv, cfg: config_lib.UpdateConfig):
  clipped = jnp.clip(r, 1.0 - cfg.epsilon, 1.0 + cfg.eps_high)
  outside = (r < 1.0 - cfg.epsilon) | (r > 1.0 + cfg.eps_high)
  return jnp.minimum(r * adv, clipped * adv), outside


def _sequence_surrogate(u_E, has_E, adv_E, c_E, cfg):
  r_E = jnp.exp(jnp.clip(u_E, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
  s_E, outside_E = _clipped(r_E, adv_E, cfg)
  count = jnp.maximum(jnp.sum(has_E), 1)
  surrogate = jnp.sum(jnp.where(has_E, c_E * s_E, 0.0)) / count
  return surrogate, jnp.sum(outside_E & has_E) / count


def _seq(logratio_ExT, mask_ExT, adv_E, c_E, cfg):
  u_E = jnp.sum(logratio_ExT, axis=1)
  return _sequence_surrogate(u_E, jnp.any(mask_ExT, axis=1), adv_E, c_E, cfg)


def _seq_mean(logratio_ExT, mask_ExT, adv_E, c_E, cfg):
  length_E = jnp.sum(mask_ExT, axis=1)
  u_E = jnp.sum(logratio_ExT, axis=1) / jnp.maximum(length_E, 1)
  return _sequence_surrogate(u_E, length_E > 0, adv_E, c_E, cfg)


def _token(logratio_ExT, mask_ExT, adv_E, c_E, cfg):
  r_ExT = jnp.exp(
      jnp.clip(logratio_ExT, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
  )
  s_ExT, outside_ExT = _clipped(r_ExT, adv_E[:, None], cfg)
  count = jnp.maximum(jnp.sum(mask_ExT), 1)
  weighted_ExT = jnp.where(mask_ExT, c_E[:, None] * s_ExT, 0.0)
  return jnp.sum(weighted_ExT) / count, jnp.sum(outside_ExT & mask_ExT) / count


# ratio mode -> (logratio_ExT, mask_ExT, adv_E, c_E, cfg) -> (L, clip frac)
RATIO_MODES: dict[str, Callable[..., tuple[jax.Array, jax.Array]]] = {
    "seq": _seq,
    "seq_mean": _seq_mean,
    "token": _token,
}
assert tuple(RATIO_MODES) == config_lib.RATIO_MODES


def masked_mean(x_ExT: jax.Array, mask_ExT: jax.Array) -> jax.Array:
  total = jnp.sum(jnp.where(mask_ExT, x_ExT, 0.0))
  return total / jnp.maximum(jnp.sum(mask_ExT), 1)


def masked_quantile(x_ExT: jax.Array, mask_ExT: jax.Array, q: float):
  """The q-quantile of the masked entries (inverted CDF; 0 when none).

  The smallest value v with at least ceil(q * n) of the n entries <= v, i.e.
  numpy's method="inverted_cdf": conservative for a monitor.
  """
  flat = jnp.where(mask_ExT, x_ExT, -jnp.inf).reshape(-1)
  n = jnp.sum(mask_ExT)
  k = jnp.clip(jnp.ceil(q * n).astype(jnp.int32) - 1, 0, jnp.maximum(n - 1, 0))
  value = jnp.sort(flat)[flat.shape[0] - n + k]
  return jnp.where(n > 0, value, 0.0)


def _own_logratio(logp_ExT: jax.Array, view: batch_lib.AgentView):
  return jnp.where(view.mask_ExT, logp_ExT - view.behaviour_logp_ExT, 0.0)


def own_logratio(agent, params, view: batch_lib.AgentView) -> jax.Array:
  """log pi_j(a_t|s_t) - log pi_j^beh(a_t|s_t) at j's positions, else 0."""
  return _own_logratio(agent.token_logprobs(params, view.inputs), view)


def agent_loss(params, ref_params, agent, cfg, view, adv_E, c_E, beta):
  """-L_j + beta * mean KL (module docstring); returns (loss, metrics)."""
  logp_ExT, kl_ExT = agent_lib.logprobs_and_kl(
      agent, params, ref_params, view.inputs
  )
  surrogate, clip_fraction = RATIO_MODES[cfg.ratio_mode](
      _own_logratio(logp_ExT, view), view.mask_ExT, adv_E, c_E, cfg
  )
  kl_mean = masked_mean(kl_ExT, view.mask_ExT)
  loss = -surrogate + beta * kl_mean
  return loss, {"surrogate": surrogate, "clip_fraction": clip_fraction}


def _take(tree, idx):
  return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), tree)


@functools.partial(jax.jit, static_argnames=("agent", "cfg"))
def update_agent(
    agent: agent_lib.Agent,
    cfg: config_lib.UpdateConfig,
    params: PyTree,
    opt_state: PyTree,
    ref_params: PyTree,
    beta: jax.Array,
    step_scale: jax.Array,
    delta: jax.Array,
    view: batch_lib.AgentView,
    adv_E: jax.Array,
    c_E: jax.Array,
    key: jax.Array,
) -> tuple[PyTree, PyTree, Metrics]:
  """One try of OPTIMIZE(L_j): epochs x minibatches of optax steps.

  `ref_params` is pi_j^cur, the KL reference: the stage-start params (the
  stage loop passes `params` itself, since each agent is updated once per
  stage and starts there). Returns the new params and optimizer state and
  scalar metrics; metrics["violated"] is
  whether the (1 - alpha)-quantile of the per-state KL over j's states
  exceeds delta (the one scalar the host reads to decide a backtrack).
  """
  tracing.count_trace("update_agent")
  tx = agent_lib.make_optimizer(cfg.optimizer)
  num_e = adv_E.shape[0]
  grad_fn = jax.value_and_grad(agent_loss, has_aux=True)

  def minibatch_step(carry, idx):
    params, opt_state = carry
    sub_view, sub_adv, sub_c = _take((view, adv_E, c_E), idx)
    (_, aux), grads = grad_fn(
        params, ref_params, agent, cfg, sub_view, sub_adv, sub_c, beta
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda u: u * step_scale, updates)
    params = optax.apply_updates(params, updates)
    return (params, opt_state), optax.tree.norm(grads)

  def epoch(carry, epoch_key):
    perm = jax.random.permutation(epoch_key, num_e)
    return jax.lax.scan(
        minibatch_step, carry, perm.reshape(cfg.minibatches, -1)
    )

  (new_params, new_opt_state), grad_norm = jax.lax.scan(
      epoch, (params, opt_state), jax.random.split(key, cfg.epochs)
  )
  logp_ExT, kl_ExT = agent_lib.logprobs_and_kl(
      agent, new_params, ref_params, view.inputs
  )
  kl_quantile = masked_quantile(kl_ExT, view.mask_ExT, cfg.quantile)
  surrogate_fn = RATIO_MODES[cfg.ratio_mode]
  new_surrogate, clip_fraction = surrogate_fn(
      _own_logratio(logp_ExT, view), view.mask_ExT, adv_E, c_E, cfg
  )
  old_surrogate, _ = surrogate_fn(
      jnp.zeros_like(kl_ExT), view.mask_ExT, adv_E, c_E, cfg
  )
  metrics = {
      # NaN-safe: a non-finite KL counts as a violation, never as a pass.
      "violated": jnp.logical_not(kl_quantile <= delta),
      "kl_quantile": kl_quantile,
      "kl_mean": masked_mean(kl_ExT, view.mask_ExT),
      "kl_max": jnp.max(jnp.where(view.mask_ExT, kl_ExT, 0.0)),
      "violation_rate": masked_mean(
          (kl_ExT > delta).astype(jnp.float32), view.mask_ExT
      ),
      "surrogate_gain": new_surrogate - old_surrogate,
      "clip_fraction": clip_fraction,
      "grad_norm": jnp.mean(grad_norm),
      "num_states": jnp.sum(view.mask_ExT),
      "num_own_episodes": jnp.sum(jnp.any(view.mask_ExT, axis=1)),
      "mean_c": jnp.mean(c_E),
      "min_c": jnp.min(c_E),
  }
  return new_params, new_opt_state, metrics


@functools.partial(jax.jit, static_argnames=("agent", "cfg"))
def surrogate_grad_norm(agent, cfg, params, view, adv_E, c_E) -> jax.Array:
  """||grad L_j|| at the stage-start params: the greedy order's measure."""
  tracing.count_trace("surrogate_grad_norm")
  grads, _ = jax.grad(agent_loss, has_aux=True)(
      params, params, agent, cfg, view, adv_E, c_E, 0.0
  )
  return optax.tree.norm(grads)


@functools.partial(jax.jit, static_argnames=("agent",))
def sequence_logratio(agent, params, view: batch_lib.AgentView) -> jax.Array:
  """u_j(tau): the sum of j's own-position log-ratios, per episode."""
  tracing.count_trace("sequence_logratio")
  return jnp.sum(own_logratio(agent, params, view), axis=1)
