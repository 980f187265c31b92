"""Stage 0 across tokenizers: the projection at the message level (DESIGN §5).

When the stronger model pi_pre does not share slot j's tokenizer, the
per-token mixture of `projection.py` is undefined (the two vocabularies
index different things). The projection is then taken over whole messages
m, each scored by each model under its own chat template and tokenizer:

  pi_new(m|s)  ∝  pi_pre(m|s)^beta * pi_cur(m|s)^(1 - beta),

with the largest beta in [0, 1] such that the message-level
KL(pi_new(.|s) || pi_cur(.|s)) <= radius. Per state s (what agent j had
seen at one of its turns in a rollout of the current team), K candidate
messages are drawn from pi_pre and K from pi_cur, i.e. from the proposal
r = (pi_pre + pi_cur) / 2. DESIGN §5 draws from pi_pre alone; pi_new lies
between the two, and at a small radius most of its mass is where pi_cur
writes, which draws from pi_pre alone rarely reach (a test fit of a
perturbed model went from 8.0 to 4.1 nats in 72 steps with both, to 6.4
with pi_pre's alone). With a_k, b_k the candidates' log-probs
under pi_pre and pi_cur, they carry two empirical measures,

  q_pre(k) ∝ pi_pre(m_k) / r(m_k),   q_cur(k) ∝ pi_cur(m_k) / r(m_k),

the self-normalised importance weights of the two models, and their
geometric mixture q_beta ∝ q_pre^beta q_cur^(1 - beta) is that of pi_new.
KL(q_beta || q_cur) is the self-normalised estimate of KL(pi_new ||
pi_cur): 0 at beta = 0, growing with beta, at beta = 1 the estimate of
KL(pi_pre || pi_cur). So the per-state bisection of `projection.py`, run
on [S, 2K] arrays of these log measures instead of [..., V] vocabularies,
picks beta (`tilt`).

The new model (initialised from pi_pre, its own tokenizer) is then fitted
to the tilted candidates by weighted maximum likelihood,

  loss = mean_s sum_k q_beta(k|s) * -log pi_theta(m_k|s),

which is KL(q_beta || pi_theta) up to a constant, optionally plus
`penalty` times the mean over states of max(0, KL(pi_theta || pi_cur) -
radius), estimated on the student's own messages (`excess_kl_surrogate`:
the maximum likelihood fit never pushes down what only pi_theta writes,
and the penalty does; off by default, see MessageFitConfig), and checked
by the (1 - alpha)-quantile over held-out states of the Monte Carlo estimate
mean_k [log pi_theta(m_k|s) - log pi_cur(m_k|s)], m_k ~ pi_theta: the
message-level KL(pi_theta || pi_cur) (`fit_messages`). A held-out state
none of whose messages could be scored (see canonical below) counts as a
violation, never as a pass.

Messages as text. A candidate's text is its decoded sample (special
tokens dropped, stripped, as the team's transcript records it). A model
scores it as its own tokenisation of the text, followed by its end-of-turn
token when the sample stopped (a message cut at max_new_tokens has none);
the context is the model's own rendering of what agent j had seen, built
turn by turn as the team's token stream builds it (`context_ids`). The
replay writes each of j's earlier messages as its canonical tokens closed
by the end-of-turn token; the team's stream holds the sampled ids, so the
two differ where an earlier message was cut at max_new_tokens, stopped on
another stop id, or had whitespace that the transcript strips (pi_cur is
then scored after a context close to, not equal to, the one it saw). The
sequence probability of a text is taken as that of this canonical
tokenisation (other tokenisations of the same text are ignored; a message
cut at max_new_tokens is scored as the probability of that prefix, which
each model cuts at its own token count, so cut messages enter as an
approximation), so a drawn message counts only when its sampled ids are that tokenisation
(decoding and re-encoding gives them back; a trained model's samples
almost always are, a random model's byte salad mostly not): the
projection is over the messages each model writes canonically, and the
fraction kept is reported. A candidate that does not fit a model's
context, or is not canonical, gets weight 0.

The radius is a bound on the KL of whole messages: since that is the sum
over a message's tokens of the per-token KL, it is stricter than SAT's
per-token trust region at the same number.
"""

import dataclasses
import time
from typing import Any, Callable, NamedTuple, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import optax

from sat_jax import models
from sat_jax import sampling
from sat_jax import scoring
from sat_jax.core import objective
from sat_jax.stage0 import fit as fit_lib
from sat_jax.stage0 import projection
from sat_jax.team import transcript as transcript_lib

PyTree = Any
Message = transcript_lib.Message
# Log-measure of an excluded candidate: finite, so that beta * x stays
# defined at beta = 0, and far below any real log-weight.
_EXCLUDED = -1e30
_LENGTH_MULTIPLE = 32  # scoring rows are padded to a multiple of this


class Tilt(NamedTuple):
  """The message-level projection of one batch of states."""

  weights_SxK: jax.Array  # q_beta: sums to 1 over valid candidates, else 0
  beta_S: jax.Array  # in [0, 1]; 0 for a state without valid candidates
  kl_S: jax.Array  # estimated KL(pi_new || pi_cur) <= radius
  kl_pre_S: jax.Array  # estimated KL(pi_pre || pi_cur) (beta = 1)
  has_valid_S: jax.Array  # bool: the state has a valid candidate


def tilt(
    logp_pre_SxK: jax.Array,
    logp_cur_SxK: jax.Array,
    valid_SxK: jax.Array,
    radius: float | jax.Array,
    pre_share: float = 1.0,
) -> Tilt:
  """The projection of the candidates' measures (module docstring).

  `logp_*` are the sequence log-probs of each candidate under pi_pre and
  pi_cur; `valid_SxK` marks the candidates that count. The candidates were
  drawn from the mixture pre_share * pi_pre + (1 - pre_share) * pi_cur
  (1: from pi_pre alone).
  """
  if not 0 < pre_share <= 1:
    raise ValueError(f"pre_share={pre_share} must be in (0, 1]")
  valid = valid_SxK.astype(bool)
  has_valid = jnp.any(valid, axis=-1)
  a = jnp.where(valid, logp_pre_SxK, 0.0).astype(jnp.float32)
  b = jnp.where(valid, logp_cur_SxK, 0.0).astype(jnp.float32)
  if pre_share == 1:
    proposal = a
  else:
    proposal = jnp.logaddexp(jnp.log(pre_share) + a, jnp.log1p(-pre_share) + b)

  def measure(log_density):  # self-normalised importance weights, logs
    x = jnp.where(valid, log_density - proposal, _EXCLUDED)
    return jnp.where(valid, jax.nn.log_softmax(x, axis=-1), _EXCLUDED)

  log_q_pre, log_q_cur = measure(a), measure(b)
  p = projection.project_log_probs(log_q_pre, log_q_cur, radius)
  kl_pre = projection.kl(log_q_pre, log_q_cur)
  weights = jnp.where(valid & has_valid[:, None], jnp.exp(p.log_probs), 0.0)
  zero = jnp.zeros_like(p.beta)
  return Tilt(
      weights,
      jnp.where(has_valid, p.beta, zero),
      jnp.where(has_valid, p.kl, zero),
      jnp.where(has_valid, kl_pre, zero),
      has_valid,
  )


def excess_kl_surrogate(
    logp_student_SxK: jax.Array,
    logp_cur_SxK: jax.Array,
    valid_SxK: jax.Array,
    radius: float | jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A loss whose gradient is that of sum_s max(0, KL_s - radius).

  KL_s = KL(pi_theta(.|s) || pi_cur(.|s)) over whole messages, estimated
  from K messages m_k ~ pi_theta with d_k = log pi_theta(m_k) - log
  pi_cur(m_k) (`logp_student_SxK` must carry pi_theta's gradient). The
  gradient of KL_s is E[d grad log pi_theta(m)] (the score function; the
  other term, E[grad log pi_theta], is 0), estimated with a leave-one-out
  baseline, b_k = the mean of the state's other d's, which keeps it
  unbiased and cuts its variance (unbiased at the messages' own
  pi_theta: `fit_messages` draws them once per batch and reuses them for
  its steps_per_batch steps, so later steps of a batch are slightly off
  policy). A state counts while its estimate is
  above `radius` and it has two valid messages. Why it is needed: the
  tilt is fitted by maximum likelihood on candidates from pi_pre and
  pi_cur, which pulls pi_theta toward them but never pushes down the
  messages that only pi_theta writes; those set the monitor's high
  quantile.

  Returns (surrogate summed over states, KL_S estimates, active_S).
  """
  valid = valid_SxK.astype(bool)
  d = jax.lax.stop_gradient(logp_student_SxK) - logp_cur_SxK
  d = jnp.where(valid, d, 0.0)
  n = jnp.sum(valid, axis=-1)
  total = jnp.sum(d, axis=-1)
  kl_S = total / jnp.maximum(n, 1)
  active = (n >= 2) & (kl_S > radius)
  baseline = (total[:, None] - d) / jnp.maximum(n - 1, 1)[:, None]
  advantage = jax.lax.stop_gradient(jnp.where(valid, d - baseline, 0.0))
  per_state = jnp.sum(
      advantage * jnp.where(valid, logp_student_SxK, 0.0), axis=-1
  ) / jnp.maximum(n, 1)
  return jnp.sum(jnp.where(active, per_state, 0.0)), kl_S, active


# ---------------------------------------------------------------- rendering


def turn_end_id(renderer: transcript_lib.Renderer) -> int:
  """The stop id that closes this renderer's assistant turns."""
  tok = renderer.tokenizer
  for token in transcript_lib.END_OF_TURN_TOKENS:
    i = tok.convert_tokens_to_ids(token)
    if i in renderer.stop_ids:
      return int(i)
  return int(renderer.stop_ids[0])


def message_ids(
    renderer: transcript_lib.Renderer, text: str, stopped: bool
) -> np.ndarray:
  """A message as this renderer's model would have written it."""
  ids = renderer.encode([text])[0]
  if stopped:
    ids = np.append(ids, np.int32(turn_end_id(renderer)))
  return ids.astype(np.int32)


def context_ids(
    renderer: transcript_lib.Renderer,
    messages: Sequence[Message],
    agent: int,
) -> np.ndarray:
  """The prompt `agent` samples from after seeing `messages`, as its stream.

  Replays the team's incremental stream (transcript.py): at each of the
  agent's earlier messages the rendering so far is appended as context,
  then the message as `message_ids` (stopped); finally the rendering of
  all of `messages` with the generation prompt.
  """
  stream, who = transcript_lib.Stream(), f"agent {agent}"
  end = turn_end_id(renderer)

  def add_context(upto: int) -> None:
    chat = renderer.chat(messages[:upto], agent)
    rendered = renderer.render([chat], who)[0]
    delta = stream.delta(rendered, who, renderer.template)
    stream.add_context(rendered, renderer.encode([delta])[0])

  for t, m in enumerate(messages):
    if m.speaker == agent:
      add_context(t)
      ids = message_ids(renderer, m.text, stopped=True)
      stream.add_action(
          ids, np.zeros(len(ids), np.float32), m.text, renderer.stop_texts[end]
      )
  add_context(len(messages))
  return stream.tokens()


# ------------------------------------------------------------------ models


class Side(NamedTuple):
  """One model with its renderer (its tokenizer and chat template)."""

  config: models.ModelConfig
  params: PyTree
  renderer: transcript_lib.Renderer


def _bucket(n: int, cap: int) -> int:
  return min(-(-n // _LENGTH_MULTIPLE) * _LENGTH_MULTIPLE, cap)


@dataclasses.dataclass
class Rows:
  """Right-padded teacher-forcing rows: context ids, then a message."""

  tokens_RxT: np.ndarray
  mask_RxT: np.ndarray
  own_RxT: np.ndarray  # the message's positions
  valid_R: np.ndarray  # bool: the row fits the model's context


def build_rows(
    contexts: Sequence[np.ndarray],
    msgs: Sequence[np.ndarray],
    config: models.ModelConfig,
    pad_id: int,
) -> Rows:
  """One row per (context, message); rows too long for the model are
  invalid (all padding)."""
  lengths = [len(c) + len(m) for c, m in zip(contexts, msgs)]
  fits = [n <= config.max_seq_len for n in lengths]
  longest = max([n for n, ok in zip(lengths, fits) if ok] or [1])
  t = _bucket(longest, config.max_seq_len)
  r = len(contexts)
  tokens = np.full((r, t), pad_id, np.int32)
  mask = np.zeros((r, t), np.int32)
  own = np.zeros((r, t), bool)
  for i, (c, m) in enumerate(zip(contexts, msgs)):
    if not fits[i]:
      continue
    n = len(c) + len(m)
    tokens[i, :n] = np.concatenate([c, m])
    mask[i, :n] = 1
    own[i, len(c) : n] = True
  return Rows(tokens, mask, own, np.asarray(fits, bool))


def sequence_logprobs(
    config: models.ModelConfig,
    params: PyTree,
    tokens_RxT: jax.Array,
    mask_RxT: jax.Array,
    own_RxT: jax.Array,
    temperature: float,
    remat: bool = False,
) -> jax.Array:
  """log pi(message | context) per row: the sum over its own positions."""
  logp_RxT = scoring.token_logprobs(
      config, params, tokens_RxT, mask_RxT, temperature, remat=remat
  )
  return jnp.sum(jnp.where(own_RxT, logp_RxT, 0.0), axis=-1)


@dataclasses.dataclass
class Candidates:
  """K messages per state drawn from one model, as text."""

  texts: list[str]  # [S * K], state-major
  stopped: list[bool]
  # The sampled ids are `message_ids` of the text (decoding and
  # re-encoding gives them back): only then is the score of the text the
  # probability of the draw.
  canonical: np.ndarray  # bool [S * K]


def draw_candidates(
    side: Side,
    prompts: Sequence[np.ndarray],
    k: int,
    options: sampling.SamplingOptions,
    key: jax.Array,
) -> Candidates:
  """k samples of `side` after each prompt (one sampler call)."""
  rows = [p for p in prompts for _ in range(k)]
  tokens, mask = sampling.pad_prompts(rows, options)
  out = sampling.sample(side.config, side.params, tokens, mask, options, key)
  ids, lengths = jax.device_get((out.tokens_BxN, out.lengths_B))
  r = side.renderer
  stops = np.asarray(r.stop_ids, np.int32)
  contents, stopped, drawn = [], [], []
  for row, n in zip(ids, lengths):
    n = int(n)
    hit = n > 0 and bool(np.isin(row[n - 1], stops))
    stopped.append(hit)
    contents.append(row[: n - 1] if hit else row[:n])
    drawn.append(row[:n])
  texts = r.decode(contents)
  canonical = np.array([
      np.array_equal(message_ids(r, t, s), d)
      for t, s, d in zip(texts, stopped, drawn)
  ])
  return Candidates(texts, stopped, canonical)


# --------------------------------------------------------------------- fit


@dataclasses.dataclass(frozen=True)
class MessageFitConfig:
  """How to fit across tokenizers; delta0 bounds the message-level KL."""

  delta0: float
  quantile: float = 0.99  # 1 - alpha, over held-out states
  slack: float = 0.0  # pass at quantile <= delta0 + slack
  target_fraction: float = 0.5  # the tilt's radius, a fraction of delta0
  # Weight of the loss term that pushes down the student's message-level
  # KL(pi_theta || pi_cur) on states where it exceeds the tilt's radius
  # (`excess_kl_surrogate`); 0 (the default) fits the tilt alone. Its
  # gradient is a noisy score-function estimate and the evidence is mixed:
  # on the tiny perturbed-model fit of the tests (120 steps, one seed) the
  # held-out quantile ended at 2.95 nats with 0, 1.94 with 0.3, 1.73 with
  # 1 and 3.88 with 10; on the demo (agent 1, delta0 1, lr 1e-3) it was
  # 3.88 after 48 steps with 0 and 14.3 with 1.
  penalty: float = 0.0
  learning_rate: float = 1e-4  # peak of a cosine decay over max_steps
  max_steps: int = 300
  steps_per_batch: int = 8
  states_per_batch: int = 32
  candidates: int = 8  # K messages per state from each of pi_pre, pi_cur
  monitor_samples: int = 8  # messages of pi_theta per held-out state
  max_new_tokens: int = 64
  temperature: float = 1.0
  remat: bool = False

  def __post_init__(self):
    fit_lib.check_fit_fields(
        self,
        max_steps=0,
        steps_per_batch=1,
        states_per_batch=1,
        candidates=2,
        monitor_samples=1,
        max_new_tokens=1,
    )

  @property
  def bound(self) -> float:
    return self.delta0 + self.slack


@dataclasses.dataclass
class MessageFitResult:
  params: PyTree  # the fitted model (pi_pre's architecture and tokenizer)
  steps: int
  inside: bool  # the last check passed
  history: list[dict[str, float]]  # one row per check


class _Scorer:
  """Jitted sequence log-probs of one model (one compile per row shape)."""

  def __init__(self, side: Side, temperature: float):
    self.side = side
    config = side.config
    self._fn = jax.jit(
        lambda p, t, m, o: sequence_logprobs(config, p, t, m, o, temperature)
    )

  def rows(self, contexts, cands: Candidates) -> Rows:
    r = self.side.renderer
    msgs = [message_ids(r, t, s) for t, s in zip(cands.texts, cands.stopped)]
    return build_rows(contexts, msgs, self.side.config, r.pad_id)

  def __call__(self, params, rows: Rows) -> np.ndarray:
    out = self._fn(params, rows.tokens_RxT, rows.mask_RxT, rows.own_RxT)
    return np.where(rows.valid_R, np.asarray(out), 0.0)


def _interleave(a: Candidates, b: Candidates, k: int) -> Candidates:
  """Per state: a's k candidates, then b's k."""
  texts, stopped, canonical = [], [], []
  for s in range(len(a.texts) // k):
    for c in (a, b):
      part = slice(s * k, (s + 1) * k)
      texts += c.texts[part]
      stopped += c.stopped[part]
      canonical.append(c.canonical[part])
  return Candidates(texts, stopped, np.concatenate(canonical))


def _mean(x, where) -> float:
  x, where = np.asarray(x), np.asarray(where)
  return float(x[where].mean()) if where.any() else 0.0


def _usable(contexts, pre: Side, cur: Side, n: int, agent: int):
  """(pre prompt ids, cur prompt ids) of contexts both can sample after."""
  pre_ids, cur_ids = [], []
  for msgs in contexts:
    a = context_ids(pre.renderer, msgs, agent)
    b = context_ids(cur.renderer, msgs, agent)
    if len(a) + n <= pre.config.max_seq_len and (
        len(b) + n <= cur.config.max_seq_len
    ):
      pre_ids.append(a)
      cur_ids.append(b)
  return pre_ids, cur_ids


def pick_states(pre_ids: list, cur_ids: list, n: int, key: jax.Array):
  """n of the (pre, cur) context pairs, a uniform draw without replacement.

  A rollout lists its episodes group by group (one prompt per group), so
  its first n contexts would all come from a prompt or two.
  """
  seed = np.asarray(jax.random.key_data(key)).ravel()
  order = np.random.default_rng(seed).permutation(len(pre_ids))[:n]
  return [pre_ids[i] for i in order], [cur_ids[i] for i in order]


def fit_messages(
    cfg: MessageFitConfig,
    pre: Side,
    cur: Side,
    agent: int,
    draw_contexts: Callable[[jax.Array], list[tuple[Message, ...]]],
    key: jax.Array,
) -> MessageFitResult:
  """Fits a copy of pi_pre to the message-level projection.

  `draw_contexts(key)` returns what agent `agent` had seen at its turns in
  a fresh rollout of the current team (`play.turn_contexts`); each batch
  takes `states_per_batch` of them at random (drawing again while too few
  fit both models' contexts; the fraction that fit is logged). The first
  batch of states, drawn with its own key, is held out for the monitor.
  """

  def options(side: Side) -> sampling.SamplingOptions:
    room = side.config.max_seq_len - cfg.max_new_tokens
    if room < 1:
      raise ValueError(
          f"max_new_tokens={cfg.max_new_tokens} leaves no prompt room in"
          f" max_seq_len={side.config.max_seq_len}"
      )
    return sampling.SamplingOptions(
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        stop_token_ids=side.renderer.stop_ids,
        pad_token_id=side.renderer.pad_id,
        prompt_buckets=tuple(range(_LENGTH_MULTIPLE, room, _LENGTH_MULTIPLE))
        + (room,),
    )

  pre_options, cur_options = options(pre), options(cur)
  score_pre, score_cur = _Scorer(pre, cfg.temperature), _Scorer(
      cur, cfg.temperature
  )
  radius = cfg.target_fraction * cfg.delta0
  schedule = optax.cosine_decay_schedule(
      cfg.learning_rate, max(cfg.max_steps, 1)
  )
  optimizer = optax.adamw(schedule, weight_decay=0.0)
  pre_config = pre.config

  def logp(params, rows):
    tokens, mask, own = rows
    return sequence_logprobs(
        pre_config, params, tokens, mask, own, cfg.temperature, cfg.remat
    )

  def loss_fn(params, rows, weights_R, num_states, student):
    fit = -jnp.sum(weights_R * logp(params, rows)) / num_states
    if not cfg.penalty:
      return fit, (fit, jnp.zeros(()))
    student_rows, cur_logp_SxK, valid_SxK = student
    surrogate, _, active_S = excess_kl_surrogate(
        logp(params, student_rows).reshape(valid_SxK.shape),
        cur_logp_SxK,
        valid_SxK,
        radius,
    )
    loss = fit + cfg.penalty * surrogate / num_states
    return loss, (fit, jnp.mean(active_S))

  @jax.jit
  def update(params, opt_state, rows, weights_R, num_states, student):
    (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, rows, weights_R, num_states, student
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, aux

  def states(k: jax.Array):
    """states_per_batch states drawn from whole rollouts (`pick_states`):
    (pre ids, cur ids, the fraction of drawn contexts that fit both)."""
    pre_ids, cur_ids, drawn, tries = [], [], 0, 0
    while len(pre_ids) < cfg.states_per_batch:
      contexts = draw_contexts(jax.random.fold_in(k, tries))
      a, b = _usable(contexts, pre, cur, cfg.max_new_tokens, agent)
      pre_ids += a
      cur_ids += b
      drawn += len(contexts)
      tries += 1
      if tries >= 8 and not pre_ids:
        raise ValueError(
            f"agent {agent}: no drawn state leaves room for"
            f" max_new_tokens={cfg.max_new_tokens} in both models' contexts"
        )
    usable = len(pre_ids) / max(drawn, 1)
    return *pick_states(pre_ids, cur_ids, cfg.states_per_batch, k), usable

  key_held, key_train, key_check = jax.random.split(key, 3)
  held = states(key_held)
  if held[2] < 1:
    logging.warning(
        "stage 0 message fit: %.1f%% of agent %d's drawn states leave no room"
        " for max_new_tokens=%d in one of the models' contexts; they are not"
        " fitted or checked",
        100 * (1 - held[2]),
        agent,
        cfg.max_new_tokens,
    )
  params = pre.params
  opt_state = jax.jit(optimizer.init)(params)
  history: list[dict[str, float]] = []

  def check(step: int, k: jax.Array, extra: dict[str, float]) -> bool:
    student = Side(pre.config, params, pre.renderer)
    m = cfg.monitor_samples
    cands = draw_candidates(student, held[0], m, pre_options, k)
    ctx_pre = [c for c in held[0] for _ in range(m)]
    ctx_cur = [c for c in held[1] for _ in range(m)]
    rows_pre = score_pre.rows(ctx_pre, cands)
    rows_cur = score_cur.rows(ctx_cur, cands)
    valid = (rows_pre.valid_R & rows_cur.valid_R & cands.canonical).reshape(
        -1, m
    )
    d = (score_pre(params, rows_pre) - score_cur(cur.params, rows_cur)).reshape(
        -1, m
    )
    n_valid = valid.sum(-1)
    ok_S = n_valid > 0
    # A held-out state none of whose messages could be scored (none
    # canonical, or none fitting a context) has no estimate: it counts as
    # a violation (+inf), never as a pass.
    kl_S = np.where(
        ok_S, np.where(valid, d, 0.0).sum(-1) / np.maximum(n_valid, 1), np.inf
    )
    quantile = float(
        objective.masked_quantile(
            jnp.asarray(kl_S), jnp.ones(kl_S.shape, bool), cfg.quantile
        )
    )
    row = {
        "step": step,
        # None (JSON null): more than alpha of the held-out states had no
        # scored message, so the quantile has no estimate.
        "kl_quantile": quantile if np.isfinite(quantile) else None,
        "kl_mean": _mean(kl_S, ok_S),
        "kl_max": float(kl_S[ok_S].max()) if ok_S.any() else 0.0,
        "unscored_states": int((~ok_S).sum()),
        "valid_fraction": float(valid.mean()),
        "canonical_fraction": float(cands.canonical.mean()),
        "states_usable_fraction": held[2],
        **extra,
    }
    history.append(row)
    logging.info("stage 0 message fit: %s", row)
    return quantile <= cfg.bound

  # The same monitor key at every check: its samples differ only through
  # the student (common random numbers), so consecutive checks compare.
  inside = check(0, key_check, {})
  step, batch = 0, 0
  while not inside and step < cfg.max_steps:
    t0 = time.perf_counter()
    k_batch = jax.random.fold_in(key_train, batch)
    pre_ids, cur_ids, usable = states(jax.random.fold_in(k_batch, 0))
    batch += 1
    # K candidates per state from each model, state-major: a state's
    # pi_pre draws, then its pi_cur draws.
    k = cfg.candidates
    from_pre = draw_candidates(
        pre, pre_ids, k, pre_options, jax.random.fold_in(k_batch, 1)
    )
    from_cur = draw_candidates(
        cur, cur_ids, k, cur_options, jax.random.fold_in(k_batch, 2)
    )
    cands = _interleave(from_pre, from_cur, k)
    ctx_pre = [c for c in pre_ids for _ in range(2 * k)]
    ctx_cur = [c for c in cur_ids for _ in range(2 * k)]
    rows_pre = score_pre.rows(ctx_pre, cands)
    rows_cur = score_cur.rows(ctx_cur, cands)
    valid = (rows_pre.valid_R & rows_cur.valid_R & cands.canonical).reshape(
        -1, 2 * k
    )
    t = tilt(
        jnp.asarray(score_pre(pre.params, rows_pre).reshape(-1, 2 * k)),
        jnp.asarray(score_cur(cur.params, rows_cur).reshape(-1, 2 * k)),
        jnp.asarray(valid),
        radius,
        pre_share=0.5,
    )
    weights_R = t.weights_SxK.reshape(-1)
    num_states = jnp.maximum(jnp.sum(t.has_valid_S), 1).astype(jnp.float32)
    student = None
    if cfg.penalty:
      # The student's own messages for the penalty, drawn once per batch
      # (their log-probs under the student are recomputed at every step).
      mine = draw_candidates(
          Side(pre.config, params, pre.renderer),
          pre_ids,
          k,
          pre_options,
          jax.random.fold_in(k_batch, 3),
      )
      mine_pre = score_pre.rows([c for c in pre_ids for _ in range(k)], mine)
      mine_cur = score_cur.rows([c for c in cur_ids for _ in range(k)], mine)
      mine_valid = mine_pre.valid_R & mine_cur.valid_R & mine.canonical
      student = (
          (mine_pre.tokens_RxT, mine_pre.mask_RxT, mine_pre.own_RxT),
          jnp.asarray(score_cur(cur.params, mine_cur).reshape(-1, k)),
          jnp.asarray(mine_valid.reshape(-1, k)),
      )
    rows = (rows_pre.tokens_RxT, rows_pre.mask_RxT, rows_pre.own_RxT)
    losses, active = [], []
    for _ in range(min(cfg.steps_per_batch, cfg.max_steps - step)):
      params, opt_state, (loss, frac) = update(
          params, opt_state, rows, weights_R, num_states, student
      )
      losses.append(loss)
      active.append(frac)
      step += 1
    has = np.asarray(t.has_valid_S)
    inside = check(
        step,
        key_check,
        {
            "loss": float(np.mean(jax.device_get(losses))),
            "penalty_active_fraction": float(np.mean(jax.device_get(active))),
            "beta_mean": _mean(t.beta_S, has),
            "tilt_kl_mean": _mean(t.kl_S, has),
            "pre_kl_mean": _mean(t.kl_pre_S, has),
            "candidates_valid_fraction": float(valid.mean()),
            "batch_states_usable_fraction": usable,
            "time_s": time.perf_counter() - t0,
        },
    )
  return MessageFitResult(params, step, inside, history)
