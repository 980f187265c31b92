"""SATConfig: every knob of one SAT stage, validated once, hashable for jit.

Modes are chosen by name from the tuples below; an unknown name is an error
that lists the valid ones (there is no fallback). `UpdateConfig` holds what
the jitted agent update reads and is passed to it as a static argument, so
agents of one architecture share one compiled update; the per-agent numbers
that change between tries or stages (beta, delta, the step scale) are traced
arguments instead.

beta across stages (the paper leaves it open): beta_i starts at its
`beta_init` (one value, or one per agent as for `delta`); every backtrack
multiplies it by `beta_raise`, up to `beta_max`; after a rejection it keeps
the raised value, so the next stage starts stricter (the cap keeps an agent
rejected stage after stage from overflowing it); after an update accepted
on its first try it decays toward that agent's own start value,
beta <- max(beta_init_i, beta / beta_decay). `beta_decay = 1` keeps beta.
A retry that could not differ from the try before it (beta at 0 or at
`beta_max`, and no step scaling) is not run: the update is rejected then.
"""

import dataclasses
import math
from typing import Sequence

METHODS = ("sat", "joint", "single", "none")
ORDERS = ("static", "reverse", "random", "greedy")
ADVANTAGE_MODES = ("reuse", "resample")
RATIO_MODES = ("seq", "seq_mean", "token")
CERTIFICATE_VARIANTS = ("episodic", "discounted")
OPTIMIZERS = ("adamw", "adam", "sgd")


def check_choice(field: str, value: object, valid: Sequence[str]) -> None:
  """Raises ValueError naming `field` unless `value` is one of `valid`."""
  if value not in valid:
    raise ValueError(f"{field}={value!r} is not one of {tuple(valid)}")


def _check(cond: bool, field: str, value: object, rule: str) -> None:
  if not cond:
    raise ValueError(f"{field}={value!r}: must be {rule}")


def check_permutation(order: Sequence[int], num_agents: int) -> tuple[int, ...]:
  """Returns `order` as a tuple, or raises if it is no permutation of 0..n-1."""
  order = tuple(int(i) for i in order)
  if sorted(order) != list(range(num_agents)):
    raise ValueError(
        f"order={order} is not a permutation of the {num_agents} agents "
        f"(expected each of 0..{num_agents - 1} exactly once)"
    )
  return order


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """optax optimizer of one agent: name, learning rate, decay, grad clip."""

  name: str = "adamw"
  learning_rate: float = 1e-5
  weight_decay: float = 0.01  # adamw only
  grad_clip: float | None = 1.0  # global-norm clip; None: no clipping
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8

  def __post_init__(self):
    check_choice("optimizer.name", self.name, OPTIMIZERS)
    _check(self.learning_rate > 0, "learning_rate", self.learning_rate, "> 0")
    _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, ">= 0")
    if self.grad_clip is not None:
      _check(self.grad_clip > 0, "grad_clip", self.grad_clip, "> 0 or None")


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
  """What the jitted update of one agent reads (a static jit argument)."""

  ratio_mode: str = "seq"  # one of RATIO_MODES
  epsilon: float = 0.2  # ratio clip: [1 - epsilon, 1 + epsilon_high]
  epsilon_high: float | None = None  # None: epsilon (symmetric clip)
  epochs: int = 2  # > 1 so that a raised beta changes the retried step
  minibatches: int = 1  # episodes per minibatch = E / minibatches
  quantile: float = 0.99  # 1 - alpha of the per-state KL monitor
  log_ratio_clamp: float = 20.0  # |u| cap before exp, against overflow
  optimizer: OptimizerConfig = OptimizerConfig()

  def __post_init__(self):
    check_choice("ratio_mode", self.ratio_mode, RATIO_MODES)
    _check(0 < self.epsilon < 1, "epsilon", self.epsilon, "in (0, 1)")
    if self.epsilon_high is not None:
      _check(self.epsilon_high > 0, "epsilon_high", self.epsilon_high, "> 0")
    _check(self.epochs >= 1, "epochs", self.epochs, ">= 1")
    _check(self.minibatches >= 1, "minibatches", self.minibatches, ">= 1")
    _check(0 < self.quantile < 1, "quantile", self.quantile, "in (0, 1)")
    _check(
        self.log_ratio_clamp > 0, "log_ratio_clamp", self.log_ratio_clamp, "> 0"
    )

  @property
  def eps_high(self) -> float:
    return self.epsilon if self.epsilon_high is None else self.epsilon_high

  @property
  def num_steps(self) -> int:
    return self.epochs * self.minibatches


@dataclasses.dataclass(frozen=True)
class CertificateConfig:
  """The per-stage lower bound (see certificate.py for the derivation).

  `reward_bounds` are the smallest and largest possible episode returns: the
  bound is in reward units, so it needs the true reward scale.
  """

  variant: str = "episodic"  # one of CERTIFICATE_VARIANTS
  reward_bounds: tuple[float, float] = (0.0, 1.0)
  # Most states one agent acts at in one episode (episodic variant; an LM
  # agent's states are its tokens). The certificate uses the batch's own
  # count when that is larger.
  horizon: int = 1
  gamma: float = 0.99  # discounted variant only
  delta_conf: float = 0.05  # the bound holds w.p. >= 1 - delta_conf
  dkw_eta: float = 0.05  # confidence of the DKW slack on the KL quantile

  def __post_init__(self):
    check_choice("certificate.variant", self.variant, CERTIFICATE_VARIANTS)
    lo, hi = self.reward_bounds
    _check(
        lo < hi, "reward_bounds", self.reward_bounds, "(low, high), low<high"
    )
    _check(self.horizon >= 1, "horizon", self.horizon, ">= 1")
    _check(0 < self.gamma < 1, "gamma", self.gamma, "in (0, 1)")
    _check(0 < self.delta_conf < 1, "delta_conf", self.delta_conf, "in (0, 1)")
    _check(0 < self.dkw_eta < 1, "dkw_eta", self.dkw_eta, "in (0, 1)")


def _values(value: float | tuple[float, ...]) -> tuple[float, ...]:
  return value if isinstance(value, tuple) else (value,)


def _per_agent(
    name: str, value: float | tuple[float, ...], num_agents: int
) -> tuple[float, ...]:
  """One value per agent from a scalar or a per-agent tuple."""
  if not isinstance(value, tuple):
    return (float(value),) * num_agents
  if len(value) != num_agents:
    raise ValueError(
        f"{name}={value} has {len(value)} entries for a team of "
        f"{num_agents} agents"
    )
  return tuple(float(v) for v in value)


def _pairs(a, b) -> tuple[tuple[float, float], ...]:
  """Per-agent pairs of two scalar-or-tuple fields.

  None while two per-agent tuples disagree in length (agent_deltas /
  agent_beta_inits report that against the team size).
  """
  n = max(len(_values(a)), len(_values(b)))
  if any(len(_values(v)) not in (1, n) for v in (a, b)):
    return ()
  return tuple(zip(_per_agent("a", a, n), _per_agent("b", b, n)))


@dataclasses.dataclass(frozen=True)
class SATConfig:
  """One SAT stage: method, order, advantage, trust region, certificate."""

  method: str = "sat"  # one of METHODS ("joint", "single", "none": baselines)
  order: str | tuple[int, ...] = "static"  # one of ORDERS, or a permutation
  advantage_mode: str = "reuse"  # one of ADVANTAGE_MODES
  delta: float | tuple[float, ...] = 0.05  # KL radius per agent; inf: none
  beta_init: float | tuple[float, ...] = 1e-3  # per agent, as delta
  beta_raise: float = 1.5  # beta *= beta_raise on a backtrack
  beta_max: float = 1e6  # cap on beta (it persists across stages)
  beta_decay: float = 1.5  # see the module docstring; 1.0 keeps beta
  max_backtracks: int = 5  # tries = 1 + max_backtracks, then reject
  backtrack_step_scale: float = 1.0  # < 1: also shrink the step per backtrack
  a_clip: float = 5.0  # |advantage| <= A_clip after the group z-score
  std_eps: float = 1e-6  # z-score denominator: std + std_eps
  single_agent: int = 0  # the trained agent of method "single"
  update: UpdateConfig = UpdateConfig()
  certificate: CertificateConfig | None = CertificateConfig()

  def __post_init__(self):
    check_choice("method", self.method, METHODS)
    if isinstance(self.order, str):
      check_choice("order", self.order, ORDERS)
    else:
      object.__setattr__(
          self, "order", check_permutation(self.order, len(self.order))
      )
    check_choice("advantage_mode", self.advantage_mode, ADVANTAGE_MODES)
    for d in _values(self.delta):  # inf: no trust region (trust_region.py)
      _check(d > 0, "delta", self.delta, "> 0 (inf: no trust region)")
    inits = _values(self.beta_init)
    for b in inits:
      _check(b >= 0, "beta_init", self.beta_init, ">= 0")
    _check(self.beta_raise > 1, "beta_raise", self.beta_raise, "> 1")
    _check(
        math.isfinite(self.beta_max) and self.beta_max >= max(inits),
        "beta_max",
        self.beta_max,
        "finite and >= beta_init",
    )
    _check(self.beta_decay >= 1, "beta_decay", self.beta_decay, ">= 1")
    _check(
        self.max_backtracks >= 0, "max_backtracks", self.max_backtracks, ">= 0"
    )
    _check(
        0 < self.backtrack_step_scale <= 1,
        "backtrack_step_scale",
        self.backtrack_step_scale,
        "in (0, 1]",
    )
    _check(self.a_clip > 0, "a_clip", self.a_clip, "> 0")
    _check(self.std_eps > 0, "std_eps", self.std_eps, "> 0")
    _check(self.single_agent >= 0, "single_agent", self.single_agent, ">= 0")
    if (
        self.max_backtracks > 0
        and self.update.num_steps == 1
        and self.backtrack_step_scale == 1.0
    ):
      # The exact KL has zero gradient at params_new == params_old, so from
      # the restored point a single step ignores beta: every retry would be
      # the same step (the public code's bug).
      raise ValueError(
          "epochs * minibatches = 1 with backtrack_step_scale = 1: raising "
          "beta cannot change a single step taken from the restored params "
          "(grad KL = 0 there); use more epochs/minibatches or "
          "backtrack_step_scale < 1"
      )
    if self.max_backtracks > 0 and self.backtrack_step_scale == 1.0:
      # beta_raise * 0 = 0: every retry would repeat the violating try
      # bitwise (the public code's bug again), so backtracking is void.
      for j, (d, b) in enumerate(_pairs(self.delta, self.beta_init)):
        if b == 0 and math.isfinite(d):
          raise ValueError(
              f"beta_init=0 for agent {j} (beta_init={self.beta_init}) with"
              f" a finite delta={self.delta}, max_backtracks="
              f"{self.max_backtracks} and backtrack_step_scale = 1: raising a"
              " zero beta leaves it 0, so every retry would repeat the"
              " violating step; set max_backtracks=0 (reject at once),"
              " beta_init > 0 or backtrack_step_scale < 1"
          )

  def agent_deltas(self, num_agents: int) -> tuple[float, ...]:
    """delta per agent; raises if a per-agent tuple has the wrong length."""
    return _per_agent("delta", self.delta, num_agents)

  def agent_beta_inits(self, num_agents: int) -> tuple[float, ...]:
    """beta_init per agent; raises if a per-agent tuple has the wrong length."""
    return _per_agent("beta_init", self.beta_init, num_agents)
