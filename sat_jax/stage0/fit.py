"""Fitting a model to the Stage-0 projection until it is inside the region.

`fit(...)` is DESIGN §5 (b) as a loop on the host over jitted steps:

  check the monitor on held-out states; stop if it passes
  repeat: draw a batch of states from the current team's occupancy,
          compute pi_pre's and pi_cur's hidden states there once,
          take `steps_per_batch` AdamW steps on the masked mean of
          KL(pi_new || pi_theta) (`distill.projected_kl`),
          check the monitor; stop when it passes or at `max_steps`

The monitor is the (1 - alpha)-quantile of KL(pi_theta || pi_cur) over the
held-out states (the agent's own positions of a separate rollout): the
statistic SAT's trust region bounds, so the fitted model can enter SAT
training as agent j without a first update that must backtrack. The
student starts from pi_pre's weights.

States come from `draw_states(key) -> States`, so the loop does not depend
on how they are produced (`swap.py` draws team rollouts).
"""

import dataclasses
import time
from typing import Any, Callable, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import optax

from sat_jax import models
from sat_jax import scoring
from sat_jax.core import objective
from sat_jax.stage0 import distill

PyTree = Any


class States(NamedTuple):
  """States of agent j: its token streams and its own action positions."""

  tokens_ExT: jax.Array  # int32
  mask_ExT: jax.Array  # int32: real tokens
  own_ExT: jax.Array  # bool: j's own action positions (the states scored)
  positions_ExA: jax.Array | None = None  # `scoring.action_positions`


def check_fit_fields(cfg: Any, **int_bounds: int) -> None:
  """Validates the fields every Stage-0 fit config has (delta0, quantile,
  target_fraction, penalty, slack, learning_rate, temperature), and the
  int fields named in `int_bounds` against their lower bounds."""
  if not 0 <= cfg.delta0 < float("inf"):
    raise ValueError(f"delta0={cfg.delta0} must be finite and >= 0")
  if not 0 < cfg.quantile < 1:
    raise ValueError(f"quantile={cfg.quantile} must be in (0, 1)")
  if not 0 < cfg.target_fraction <= 1:
    raise ValueError(f"target_fraction={cfg.target_fraction} must be in (0, 1]")
  for field in ("penalty", "slack"):
    if not getattr(cfg, field) >= 0:
      raise ValueError(f"{field}={getattr(cfg, field)} must be >= 0")
  if not cfg.learning_rate > 0:
    raise ValueError(f"learning_rate={cfg.learning_rate} must be > 0")
  for field, low in int_bounds.items():
    value = getattr(cfg, field)
    if not isinstance(value, int) or value < low:
      raise ValueError(f"{field}={value} must be an int >= {low}")
  scoring.check_temperature(cfg.temperature)


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """How to fit; delta0 is agent j's trust-region radius."""

  delta0: float
  quantile: float = 0.99  # 1 - alpha
  slack: float = 0.0  # pass at quantile <= delta0 + slack
  # The projection's radius is target_fraction * delta0: a student that
  # fits pi_new only approximately then still lands inside delta0.
  target_fraction: float = 0.5
  # The loss adds penalty * mean over states of
  # max(0, KL(pi_theta || pi_cur) - target_fraction * delta0): the
  # projection's KL divergence alone fits the bulk of the states and leaves
  # a tail that the (1 - alpha)-quantile monitor sees.
  penalty: float = 10.0
  learning_rate: float = 1e-4  # peak of a cosine decay over max_steps
  max_steps: int = 300
  steps_per_batch: int = 8
  temperature: float = 1.0
  chunk_size: int = scoring.DEFAULT_CHUNK_SIZE

  def __post_init__(self):
    check_fit_fields(self, max_steps=0, steps_per_batch=1, chunk_size=1)

  @property
  def bound(self) -> float:
    return self.delta0 + self.slack


class Model(NamedTuple):
  config: models.ModelConfig
  params: PyTree


@dataclasses.dataclass
class FitResult:
  params: PyTree  # the fitted student
  steps: int
  inside: bool  # the last check passed
  history: list[dict[str, float]]  # one row per check


def _monitor(cfg: FitConfig, student: Model, cur: Model, s: States):
  kl_ExT = scoring.state_kl(
      student.config,
      student.params,
      cur.config,
      cur.params,
      s.tokens_ExT,
      s.mask_ExT,
      cfg.temperature,
      cfg.chunk_size,
      positions_BxA=s.positions_ExA,
  )
  return {
      "kl_quantile": objective.masked_quantile(kl_ExT, s.own_ExT, cfg.quantile),
      "kl_mean": objective.masked_mean(kl_ExT, s.own_ExT),
      "kl_max": jnp.max(jnp.where(s.own_ExT, kl_ExT, 0.0)),
  }


def _teachers(cfg: FitConfig, pre: Model, cur: Model, s: States):
  return tuple(
      distill.teacher_hidden(
          m.config, m.params, s.tokens_ExT, s.mask_ExT, s.positions_ExA
      )
      for m in (pre, cur)
  )


def _loss(cfg: FitConfig, config, params, pre: Model, cur: Model, h, s):
  radius = cfg.target_fraction * cfg.delta0
  loss_ExT, beta_ExT, kl_cur_ExT = distill.projected_kl(
      config,
      params,
      models.unembed_matrix(pre.config, pre.params),
      h[0],
      models.unembed_matrix(cur.config, cur.params),
      h[1],
      s.tokens_ExT,
      s.mask_ExT,
      radius,
      cfg.temperature,
      cfg.chunk_size,
      positions_BxA=s.positions_ExA,
  )
  excess_ExT = jnp.maximum(kl_cur_ExT - radius, 0.0)
  loss = objective.masked_mean(loss_ExT, s.own_ExT)
  if cfg.penalty:
    loss += cfg.penalty * objective.masked_mean(excess_ExT, s.own_ExT)
  return loss, objective.masked_mean(beta_ExT, s.own_ExT)


def fit(
    cfg: FitConfig,
    pre: Model,
    cur: Model,
    draw_states: Callable[[jax.Array], States],
    key: jax.Array,
) -> FitResult:
  """Fits a copy of pi_pre to the projection (module docstring)."""
  if pre.config.vocab_size != cur.config.vocab_size:
    raise ValueError(
        f"pi_pre has vocab_size {pre.config.vocab_size}, pi_cur"
        f" {cur.config.vocab_size}: Stage 0 with one tokenizer needs equal"
        " vocabularies"
    )
  # Cosine decay to 0 at max_steps: the tail that the quantile monitor sees
  # settles as the steps shrink (a constant rate keeps it moving).
  schedule = optax.cosine_decay_schedule(
      cfg.learning_rate, max(cfg.max_steps, 1)
  )
  optimizer = optax.adamw(schedule, weight_decay=0.0)
  # The configs are static (closed over); only arrays cross the jits.
  monitor = jax.jit(
      lambda p, c, s: _monitor(
          cfg, Model(pre.config, p), Model(cur.config, c), s
      )
  )
  teachers = jax.jit(
      lambda p, c, s: _teachers(
          cfg, Model(pre.config, p), Model(cur.config, c), s
      )
  )

  @jax.jit
  def update(params, opt_state, pre_params, cur_params, h, s):
    pre_m, cur_m = Model(pre.config, pre_params), Model(cur.config, cur_params)
    grad_fn = jax.value_and_grad(
        lambda q: _loss(cfg, pre.config, q, pre_m, cur_m, h, s), has_aux=True
    )
    (loss, beta), grads = grad_fn(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, beta

  key_held, key_train = jax.random.split(key)
  held = draw_states(key_held)
  params = pre.params
  opt_state = jax.jit(optimizer.init)(params)
  history = []

  def check(step: int, extra: dict[str, float]) -> bool:
    row = {k: float(v) for k, v in monitor(params, cur.params, held).items()}
    row.update(step=step, **extra)
    history.append(row)
    logging.info("stage 0 fit: %s", row)
    return row["kl_quantile"] <= cfg.bound

  inside = check(0, {})
  step, batch = 0, 0
  while not inside and step < cfg.max_steps:
    t0 = time.perf_counter()
    states = draw_states(jax.random.fold_in(key_train, batch))
    batch += 1
    h = teachers(pre.params, cur.params, states)
    losses, betas = [], []
    for _ in range(min(cfg.steps_per_batch, cfg.max_steps - step)):
      params, opt_state, loss, beta = update(
          params, opt_state, pre.params, cur.params, h, states
      )
      losses.append(loss)
      betas.append(beta)
      step += 1
    inside = check(
        step,
        {
            "loss": float(jnp.mean(jnp.stack(losses))),
            "beta_mean": float(jnp.mean(jnp.stack(betas))),
            "time_s": time.perf_counter() - t0,
        },
    )
  return FitResult(params, step, inside, history)
