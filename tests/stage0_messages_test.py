"""Stage 0 across tokenizers: the message-level projection and its fit."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax import models
from sat_jax import testing
from sat_jax.stage0 import messages as msg_lib
from sat_jax.stage0 import projection
from sat_jax.team import transcript

Message = transcript.Message
TASK = transcript.TASK


# ------------------------------------------------------------------- tilt


def _softmax(x):
  e = np.exp(x - np.max(x))
  return e / e.sum()


def _kl(p, q):
  return float(np.sum(p * (np.log(p) - np.log(q))))


def test_tilt_ends_uniform_draw_and_importance_weights():
  d = np.array([[0.3, -1.2, 2.0, 0.5]], np.float32)
  lpre = np.array([[-3.0, -4.0, -2.5, -6.0]], np.float32)
  lcur = lpre - d
  valid = np.ones_like(d, bool)
  q_cur = _softmax(-d[0])
  uniform = np.full(4, 0.25)
  kl_pre = _kl(uniform, q_cur)  # = mean(d) + log mean exp(-d)
  assert kl_pre == pytest.approx(
      d.mean() + np.log(np.mean(np.exp(-d))), rel=1e-5
  )
  wide = msg_lib.tilt(lpre, lcur, valid, kl_pre + 1.0)
  np.testing.assert_allclose(wide.weights_SxK[0], uniform, atol=1e-6)
  assert float(wide.beta_S[0]) == 1.0
  assert float(wide.kl_pre_S[0]) == pytest.approx(kl_pre, rel=1e-5)
  zero = msg_lib.tilt(lpre, lcur, valid, 0.0)
  np.testing.assert_allclose(zero.weights_SxK[0], q_cur, rtol=1e-5)
  assert float(zero.beta_S[0]) == 0.0


def test_tilt_between_is_the_geometric_mixture_at_the_radius():
  rng = np.random.default_rng(0)
  d = rng.normal(0, 2, (5, 6)).astype(np.float32)
  lpre = rng.normal(-5, 1, (5, 6)).astype(np.float32)
  radius = 0.2
  t = msg_lib.tilt(lpre, lpre - d, np.ones_like(d, bool), radius)
  for s in range(5):
    beta = float(t.beta_S[s])
    w = _softmax(-(1 - beta) * d[s])
    np.testing.assert_allclose(t.weights_SxK[s], w, rtol=1e-4, atol=1e-7)
    kl = _kl(w, _softmax(-d[s]))
    assert kl <= radius + 1e-5
    if beta < 1:  # on the boundary (bisection to float32 resolution)
      assert kl == pytest.approx(radius, abs=1e-4)
    assert float(t.kl_S[s]) == pytest.approx(kl, abs=1e-5)


def test_tilt_with_draws_from_both_models_weights_by_the_mixture():
  """Candidates from 0.3 pi_pre + 0.7 pi_cur: the measures are
  pi / proposal, normalised; at radius 0 the tilt is q_cur."""
  a = np.array([[-1.0, -2.0, -0.5, -3.0]], np.float32)
  b = np.array([[-2.0, -0.7, -1.5, -1.0]], np.float32)
  valid = np.ones_like(a, bool)
  mix = np.log(0.3 * np.exp(a[0]) + 0.7 * np.exp(b[0]))
  q_pre, q_cur = _softmax(a[0] - mix), _softmax(b[0] - mix)
  zero = msg_lib.tilt(a, b, valid, 0.0, pre_share=0.3)
  np.testing.assert_allclose(zero.weights_SxK[0], q_cur, rtol=1e-5)
  assert float(zero.kl_pre_S[0]) == pytest.approx(_kl(q_pre, q_cur), rel=1e-5)
  wide = msg_lib.tilt(a, b, valid, 100.0, pre_share=0.3)
  np.testing.assert_allclose(wide.weights_SxK[0], q_pre, rtol=1e-5)
  with pytest.raises(ValueError, match="pre_share=0"):
    msg_lib.tilt(a, b, valid, 0.1, pre_share=0.0)


def test_tilt_excludes_invalid_candidates_and_empty_states():
  d = np.array([[0.3, -1.2, 2.0, 0.5], [1.0, 2.0, 3.0, 4.0]], np.float32)
  lpre = np.full_like(d, -4.0)
  valid = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], bool)
  t = msg_lib.tilt(lpre, lpre - d, valid, 0.1)
  kept = msg_lib.tilt(
      lpre[:1, [0, 2, 3]], (lpre - d)[:1, [0, 2, 3]], valid[:1, [0, 2, 3]], 0.1
  )
  np.testing.assert_allclose(
      t.weights_SxK[0, [0, 2, 3]], kept.weights_SxK[0], rtol=1e-6
  )
  assert float(t.weights_SxK[0, 1]) == 0.0
  assert float(t.beta_S[0]) == pytest.approx(float(kept.beta_S[0]))
  np.testing.assert_array_equal(t.weights_SxK[1], 0.0)
  assert not bool(t.has_valid_S[1]) and float(t.beta_S[1]) == 0.0


def test_tilt_on_drawn_messages_estimates_the_exact_projection():
  """A finite message space: the estimate converges to the exact answer."""
  rng = np.random.default_rng(1)
  m = 12  # messages
  lpre = np.log(_softmax(rng.normal(0, 1.0, m)))
  lcur = np.log(_softmax(rng.normal(0, 1.0, m)))
  radius = 0.15
  exact = projection.project_log_probs(
      jnp.asarray(lpre[None]), jnp.asarray(lcur[None]), radius
  )
  draws = rng.choice(m, size=(1, 20000), p=np.exp(lpre))
  t = msg_lib.tilt(
      lpre[draws].astype(np.float32),
      lcur[draws].astype(np.float32),
      np.ones(draws.shape, bool),
      radius,
  )
  assert float(t.beta_S[0]) == pytest.approx(float(exact.beta[0]), abs=0.03)
  # The tilted candidates, pooled per message, are pi_new.
  pooled = np.bincount(
      draws[0], weights=np.asarray(t.weights_SxK[0]), minlength=m
  )
  np.testing.assert_allclose(pooled, np.exp(exact.log_probs[0]), atol=0.01)
  assert float(t.kl_pre_S[0]) == pytest.approx(
      float(projection.kl(jnp.asarray(lpre), jnp.asarray(lcur))), abs=0.02
  )


def test_excess_kl_surrogate_has_the_gradient_of_the_excess_kl():
  """A finite message space with pi_theta = softmax(theta): on drawn
  messages the surrogate's gradient estimates grad KL(pi_theta || pi_cur)
  where that KL is above the radius, and is 0 where it is below."""
  rng = np.random.default_rng(2)
  m, k, radius = 6, 40000, 0.05
  lcur = np.log(_softmax(rng.normal(0, 1.0, m)))
  theta = np.stack([rng.normal(0, 1.5, m), lcur + rng.normal(0, 0.05, m)])
  exact_kl = [_kl(_softmax(t), np.exp(lcur)) for t in theta]
  assert exact_kl[0] > 4 * radius and exact_kl[1] < radius / 4
  draws = np.stack(
      [rng.choice(m, size=k, p=_softmax(t)) for t in theta]
  )  # [S, K]

  def surrogate(th):
    logp_SxK = jnp.take_along_axis(
        jax.nn.log_softmax(th, axis=-1), jnp.asarray(draws), axis=-1
    )
    return msg_lib.excess_kl_surrogate(
        logp_SxK, jnp.asarray(lcur[draws]), jnp.ones(draws.shape, bool), radius
    )

  grad = jax.grad(lambda th: surrogate(th)[0])(jnp.asarray(theta))
  _, kl_S, active_S = surrogate(jnp.asarray(theta))
  np.testing.assert_allclose(kl_S, exact_kl, atol=0.03)
  assert list(np.asarray(active_S)) == [True, False]

  def exact(th):
    logq = jax.nn.log_softmax(th)
    return jnp.sum(jnp.exp(logq) * (logq - lcur))

  want = jax.grad(exact)(jnp.asarray(theta[0]))
  assert float(jnp.max(jnp.abs(want))) > 0.1
  np.testing.assert_allclose(grad[0], want, atol=0.03)
  np.testing.assert_array_equal(grad[1], 0.0)


# -------------------------------------------------------------- rendering


@functools.lru_cache(maxsize=None)
def _tokenizers(root: str):
  root = pathlib.Path(root)
  a = models.load_tokenizer(testing.build_tiny_tokenizer(root / "a"))
  b = models.load_tokenizer(
      testing.build_tiny_tokenizer(root / "b", vocab_size=300)
  )
  return a, b


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  return _tokenizers(str(tmp_path_factory.mktemp("toks")))


def _renderer(tok, name="agent"):
  return transcript.Renderer(tok, name=name)


_TRANSCRIPT = (
    Message(TASK, "what is two plus three?"),
    Message(0, "two plus three is five.", 0),
    Message(1, "so the answer is 5", 0),
    Message(2, "I agree: 5", 0),
    Message(0, "final answer 5", 1),
    Message(1, "the total is five", 1),
)


@pytest.mark.parametrize("which", [0, 1])
def test_context_ids_grow_as_a_stream_and_spell_the_rendering(
    tokenizers, which
):
  r = _renderer(tokenizers[which])
  agent = 1
  full = msg_lib.context_ids(r, _TRANSCRIPT[:5], agent)
  # The text is the template's rendering of what agent 1 saw.
  chat = r.chat(_TRANSCRIPT[:5], agent)
  text = r.tokenizer.decode(full.tolist(), skip_special_tokens=False)
  assert text == r.render([chat])[0]
  # The stream only appends: the context of its first turn, then that
  # message as written (with its end-of-turn id), then what came after.
  first = msg_lib.context_ids(r, _TRANSCRIPT[:2], agent)
  own = msg_lib.message_ids(r, _TRANSCRIPT[2].text, stopped=True)
  np.testing.assert_array_equal(full[: len(first)], first)
  np.testing.assert_array_equal(full[len(first) : len(first) + len(own)], own)
  assert own[-1] == r.tokenizer.convert_tokens_to_ids(testing.IM_END)
  # A first turn is the whole rendering tokenised.
  np.testing.assert_array_equal(
      first, r.encode([r.render([r.chat(_TRANSCRIPT[:2], agent)])[0]])[0]
  )


def test_the_two_test_tokenizers_differ(tokenizers):
  a, b = tokenizers
  text = _TRANSCRIPT[1].text
  assert a(text)["input_ids"] != b(text)["input_ids"]


# --------------------------------------------------------- the fit itself


_CHARS = testing.build_char_tokenizer()
_CONFIG = testing.tiny_config("qwen3", max_seq_len=160, vocab_size=len(_CHARS))


@functools.lru_cache(maxsize=None)
def _cur_params():
  params = jax.jit(lambda k: models.init_params(_CONFIG, k))(jax.random.key(3))
  return jax.tree.map(lambda x: x * 3 if x.ndim >= 2 else x, params)


def _moved(params, perm, noise: float, seed: int):
  """The same model over permuted ids (tied embedding rows moved), plus
  Gaussian noise of scale `noise` on every matrix."""
  out = testing.permute_vocab(params, perm)
  leaves, tree = jax.tree.flatten(out)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  leaves = [
      x + noise * jax.random.normal(k, x.shape) if x.ndim >= 2 else x
      for x, k in zip(leaves, keys)
  ]
  return jax.tree.unflatten(tree, leaves)


def _contexts(key):
  del key
  prompts = [
      "what is two plus three?",
      "how many apples are left?",
      "solve: seven minus four",
      "the team has ten books",
  ]
  return [
      (Message(TASK, p), Message(0, "we think step by step.", 0))
      for p in prompts
  ]


def _fit_cfg(**kw):
  return msg_lib.MessageFitConfig(**{
      "delta0": 0.5,
      "states_per_batch": 4,
      "candidates": 4,
      "monitor_samples": 4,
      "max_new_tokens": 8,
      **kw,
  })


def test_the_same_model_over_other_ids_is_inside_at_step_0(tmp_path):
  """pi_pre = pi_cur with permuted ids: every message has d = 0 exactly
  (up to float rounding), so the message-level KL is 0 and nothing is fit.
  This checks the whole path across tokenizers: rendering, re-tokenising
  the sampled texts and scoring them under each model's own ids."""
  a = _CHARS
  b, perm = testing.permuted_tokenizer(a, tmp_path / "perm", seed=0)
  cur = msg_lib.Side(_CONFIG, _cur_params(), _renderer(a))
  pre = msg_lib.Side(_CONFIG, _moved(_cur_params(), perm, 0.0, 0), _renderer(b))
  text = "two plus three is five."
  assert a(text)["input_ids"] != b(text)["input_ids"]
  result = msg_lib.fit_messages(
      _fit_cfg(delta0=1e-3), pre, cur, 1, _contexts, jax.random.key(0)
  )
  row = result.history[0]
  assert result.inside and result.steps == 0
  assert abs(row["kl_mean"]) < 1e-4 and abs(row["kl_max"]) < 1e-4
  assert row["valid_fraction"] > 0.5


def test_pick_states_draws_aligned_pairs_from_the_whole_rollout():
  pre = [np.array([i]) for i in range(100)]
  cur = [np.array([1000 + i]) for i in range(100)]
  picks = []
  for seed in range(20):
    a, b = msg_lib.pick_states(pre, cur, 10, jax.random.key(seed))
    got = [int(x[0]) for x in a]
    assert [int(x[0]) - 1000 for x in b] == got  # pairs stay together
    assert len(set(got)) == 10  # without replacement
    picks += got
  again, _ = msg_lib.pick_states(pre, cur, 10, jax.random.key(19))
  assert [int(x[0]) for x in again] == got  # a key gives one draw
  # Uniform over all 100, not the rollout's first groups: 200 draws put
  # about 100 in the second half (binomial sd 7).
  assert 70 < sum(i >= 50 for i in picks) < 130
  assert len(set(picks)) > 70


def _writes_only(params, token: int):
  """The model with every logit but `token`'s far below it: the residual's
  dimension 0 holds the embedding's column 0 (1 everywhere, 5 at `token`:
  no layer writes to it), and the final norm keeps that dimension alone."""
  embed = params["embed"].at[:, 0].set(1.0).at[token, 0].set(5.0)
  layers = dict(params["layers"])
  for name in ("o_proj", "down_proj"):
    layers[name] = layers[name].at[..., 0].set(0.0)
  norm = jnp.zeros_like(params["final_norm"]).at[0].set(1000.0)
  return dict(params, embed=embed, layers=layers, final_norm=norm)


def test_held_out_states_without_a_scored_message_fail_the_check(tmp_path):
  """A student that writes only a special token (dropped when decoded, so
  no sample is canonical) has no message to score on any held-out state:
  that is a failed check with no estimate, not a pass at 0."""
  a = _CHARS
  b, _ = testing.permuted_tokenizer(a, tmp_path / "perm", seed=0)
  cur = msg_lib.Side(_CONFIG, _cur_params(), _renderer(a))
  pad_only = _writes_only(_cur_params(), b.pad_token_id)
  pre = msg_lib.Side(_CONFIG, pad_only, _renderer(b))
  cfg = _fit_cfg(delta0=1e-3, max_steps=0)
  result = msg_lib.fit_messages(cfg, pre, cur, 1, _contexts, jax.random.key(0))
  (row,) = result.history
  assert not result.inside and result.steps == 0
  assert row["canonical_fraction"] == 0.0 and row["valid_fraction"] == 0.0
  assert row["unscored_states"] == cfg.states_per_batch
  assert row["kl_quantile"] is None


@pytest.mark.parametrize("penalty", [0.0, 1.0])
def test_the_fit_brings_a_perturbed_model_inside(tmp_path, penalty):
  """Noise on the permuted copy puts pi_pre about 8 nats per message away;
  the fit must bring the held-out quantile under half of that. (Random
  models write high-entropy messages, so the estimates take many draws to
  settle; the bound is set where 120 steps of this tiny fit reach it.)"""
  a = _CHARS
  b, perm = testing.permuted_tokenizer(a, tmp_path / "perm", seed=1)
  cur = msg_lib.Side(_CONFIG, _cur_params(), _renderer(a))
  pre = msg_lib.Side(
      _CONFIG, _moved(_cur_params(), perm, 0.15, 1), _renderer(b)
  )
  cfg = _fit_cfg(
      delta0=4.0,
      learning_rate=1e-2,
      max_steps=120,
      steps_per_batch=4,
      candidates=8,
      monitor_samples=8,
      penalty=penalty,
  )
  result = msg_lib.fit_messages(cfg, pre, cur, 1, _contexts, jax.random.key(1))
  first, last = result.history[0], result.history[-1]
  assert first["kl_quantile"] > 1.5 * cfg.bound  # it had to be fitted
  assert result.inside and last["kl_quantile"] <= cfg.bound
  assert 0 < result.steps <= cfg.max_steps
  # Each batch's tilt stayed inside its radius, below the untilted estimate.
  for row in result.history[1:]:
    assert row["tilt_kl_mean"] <= cfg.target_fraction * cfg.delta0 + 1e-4
    assert row["tilt_kl_mean"] <= row["pre_kl_mean"] + 1e-6
  # With a penalty, it counted on some states while the fit was outside.
  active = [row["penalty_active_fraction"] for row in result.history[1:]]
  assert (max(active) > 0) == (penalty > 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(delta0=-1.0), "delta0=-1.0"),
        (dict(candidates=1), "candidates=1 must be an int >= 2"),
        (dict(states_per_batch=0), "states_per_batch=0"),
        (dict(quantile=1.0), "quantile=1.0"),
        (dict(penalty=-1.0), "penalty=-1.0"),
    ],
)
def test_bad_message_fit_config_names_the_field(kwargs, message):
  with pytest.raises(ValueError, match=message):
    _fit_cfg(**kwargs)
