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
When beta is 0 the penalty term is left out of the compiled loss altogether
(`kl_penalty=False`, a static argument): its reference forward pass and
full-vocabulary KL would cost about a third of the update for a term that
is 0 (plain GRPO/PPO runs, beta_init = 0, where beta stays 0).
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


def agent_loss(
    params,
    ref_params,
    agent,
    cfg,
    view,
    adv_E,
    c_E,
    beta,
    kl_penalty=True,
    reference=None,
):
  """-L_j + beta * mean KL (module docstring); returns (loss, metrics).

  With `kl_penalty=False` (static) the loss is -L_j alone and `beta` and
  `ref_params` are not used. `reference`: the agent's `kl_reference` of
  ref_params on this view's episodes, if it has one.
  """
  if kl_penalty:
    logp_ExT, kl_ExT = agent_lib.logprobs_and_kl(
        agent, params, ref_params, view.inputs, reference
    )
  else:
    logp_ExT = agent.token_logprobs(params, view.inputs)
  surrogate, clip_fraction = RATIO_MODES[cfg.ratio_mode](
      _own_logratio(logp_ExT, view), view.mask_ExT, adv_E, c_E, cfg
  )
  loss = -surrogate
  if kl_penalty:
    loss = loss + beta * masked_mean(kl_ExT, view.mask_ExT)
  return loss, {"surrogate": surrogate, "clip_fraction": clip_fraction}


def _take(tree, idx):
  return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), tree)


@functools.partial(
    jax.jit,
    static_argnames=("agent", "cfg", "kl_penalty", "monitor", "measure_new"),
)
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
    kl_penalty: bool = True,
    monitor: bool = True,
    measure_new: bool = True,
) -> tuple[PyTree, PyTree, Metrics, jax.Array | None]:
  """One try of OPTIMIZE(L_j): epochs x minibatches of optax steps.

  `ref_params` is pi_j^cur, the KL reference: the stage-start params (the
  stage loop passes `params` itself, since each agent is updated once per
  stage and starts there). `kl_penalty=False` compiles the loss without its
  KL term (for beta = 0; module docstring). Returns the new params and
  optimizer state, scalar metrics, and u_E (the new params' per-episode
  sequence log-ratio of `sequence_logratio`, from the monitor's pass, so
  the stage loop needs no second pass); metrics["violated"] is whether the
  (1 - alpha)-quantile of the per-state KL over j's states exceeds delta
  (the one scalar the host reads to decide a backtrack). `monitor=False`
  (no trust region: delta = inf and no certificate) skips the KL pass: the
  kl_* metrics are then absent and violated is False. `measure_new=False`
  (only without the monitor) skips the pass over the new params
  altogether, for an update whose u_E nothing reads (the stage's last
  agent when there is no certificate): u_E is then None and the
  new-params metrics (surrogate_gain, clip_fraction) are absent.
  """
  if monitor and not measure_new:
    raise ValueError("the KL monitor measures the new params: measure_new")
  tracing.count_trace("update_agent")
  tx = agent_lib.make_optimizer(cfg.optimizer)
  num_e = adv_E.shape[0]
  grad_fn = jax.value_and_grad(agent_loss, has_aux=True)
  # ref_params stay fixed through the try: their side of the KL once, for
  # every minibatch step and the monitor (an LM: one body pass, not one
  # per step).
  reference = (
      agent_lib.kl_reference(agent, ref_params, view.inputs)
      if kl_penalty or monitor
      else None
  )

  def minibatch_step(carry, idx):
    params, opt_state = carry
    sub_view, sub_adv, sub_c, sub_ref = _take(
        (view, adv_E, c_E, reference), idx
    )
    (_, aux), grads = grad_fn(
        params,
        ref_params,
        agent,
        cfg,
        sub_view,
        sub_adv,
        sub_c,
        beta,
        kl_penalty,
        sub_ref,
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
  metrics = {
      "violated": jnp.asarray(False),
      "grad_norm": jnp.mean(grad_norm),
      "num_states": jnp.sum(view.mask_ExT),
      "num_own_episodes": jnp.sum(jnp.any(view.mask_ExT, axis=1)),
      "max_episode_states": jnp.max(jnp.sum(view.mask_ExT, axis=1)),
      "mean_c": jnp.mean(c_E),
      "min_c": jnp.min(c_E),
  }
  if not measure_new:
    return new_params, new_opt_state, metrics, None
  if monitor:
    logp_ExT, kl_ExT = agent_lib.logprobs_and_kl(
        agent, new_params, ref_params, view.inputs, reference
    )
    kl_quantile = masked_quantile(kl_ExT, view.mask_ExT, cfg.quantile)
    # A NaN KL at any of j's states is a violation, never a pass: the sort
    # puts NaNs last, where a quantile below 1 would not see a few of them
    # (and a NaN quantile fails the comparison).
    any_nan = jnp.any(view.mask_ExT & jnp.isnan(kl_ExT))
    metrics |= {
        "violated": jnp.logical_not(kl_quantile <= delta) | any_nan,
        "kl_quantile": kl_quantile,
        "kl_mean": masked_mean(kl_ExT, view.mask_ExT),
        "kl_max": jnp.max(jnp.where(view.mask_ExT, kl_ExT, 0.0)),
        "violation_rate": masked_mean(
            (kl_ExT > delta).astype(jnp.float32), view.mask_ExT
        ),
    }
  else:
    logp_ExT = agent.token_logprobs(new_params, view.inputs)
  surrogate_fn = RATIO_MODES[cfg.ratio_mode]
  logratio_ExT = _own_logratio(logp_ExT, view)
  new_surrogate, clip_fraction = surrogate_fn(
      logratio_ExT, view.mask_ExT, adv_E, c_E, cfg
  )
  old_surrogate, _ = surrogate_fn(
      jnp.zeros_like(logratio_ExT), view.mask_ExT, adv_E, c_E, cfg
  )
  metrics |= {
      "surrogate_gain": new_surrogate - old_surrogate,
      "clip_fraction": clip_fraction,
  }
  return new_params, new_opt_state, metrics, jnp.sum(logratio_ExT, axis=1)


@functools.partial(jax.jit, static_argnames=("agent", "cfg"))
def surrogate_grad_norm(agent, cfg, params, view, adv_E, c_E) -> jax.Array:
  """||grad L_j|| at the stage-start params: the greedy order's measure."""
  tracing.count_trace("surrogate_grad_norm")
  # No KL term: at params == ref_params its gradient is exactly 0.
  grads, _ = jax.grad(agent_loss, has_aux=True)(
      params, params, agent, cfg, view, adv_E, c_E, 0.0, False
  )
  return optax.tree.norm(grads)


@functools.partial(jax.jit, static_argnames=("agent",))
def sequence_logratio(agent, params, view: batch_lib.AgentView) -> jax.Array:
  """u_j(tau): the sum of j's own-position log-ratios, per episode."""
  tracing.count_trace("sequence_logratio")
  return jnp.sum(own_logratio(agent, params, view), axis=1)
