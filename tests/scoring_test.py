"""Tests for sat_jax.scoring: chunked log-probs, entropy and KL vs naive."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax import models
from sat_jax import scoring


def _jit_grad(fn, argnums=0):
  # One compile instead of op-by-op dispatch: faster tests, same numbers.
  return jax.jit(jax.grad(fn, argnums))


def _rand(seed, b=2, t=13, d=8, v=50, scale=1.0):
  k = jax.random.split(jax.random.PRNGKey(seed), 3)
  h = scale * jax.random.normal(k[0], (b, t, d))
  w = jax.random.normal(k[1], (d, v))
  y = jax.random.randint(k[2], (b, t), 0, v)
  return h, w, y


def _naive_logq(h, w, tau):
  return jax.nn.log_softmax(
      jnp.einsum("btd,dv->btv", h, w, preferred_element_type=jnp.float32) / tau,
      axis=-1,
  )


def _naive_logprobs(h, w, y, tau):
  return jnp.take_along_axis(_naive_logq(h, w, tau), y[..., None], -1)[..., 0]


def _naive_kl(h_new, w_new, h_old, w_old, tau):
  a = _naive_logq(h_new, w_new, tau)
  b = _naive_logq(h_old, w_old, tau)
  return jnp.sum(jnp.exp(a) * (a - b), axis=-1)


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


# ---------------------------------------------------------------- log-probs


@pytest.mark.parametrize("chunk_size,tau", [(4, 1.0), (5, 0.7), (64, 1.6)])
def test_logprobs_match_naive_values_and_grads(chunk_size, tau):
  # 13 positions: chunk 4 and 5 do not divide T, 64 exceeds it.
  h, w, y = _rand(0)
  got = scoring.token_logprobs_from_hidden(h, w, y, tau, chunk_size)
  np.testing.assert_allclose(got, _naive_logprobs(h, w, y, tau), atol=1e-5)

  # A non-uniform cotangent, so that a mix-up between positions shows.
  c = jax.random.normal(jax.random.PRNGKey(9), y.shape)

  def loss(fn):
    return lambda h, w: jnp.sum(c * fn(h, w))

  g_got = _jit_grad(
      loss(lambda h, w: scoring.token_logprobs_from_hidden(h, w, y, tau, 4)),
      (0, 1),
  )(h, w)
  g_ref = _jit_grad(loss(lambda h, w: _naive_logprobs(h, w, y, tau)), (0, 1))(
      h, w
  )
  for a, b in zip(g_got, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_logprobs_hand_computed():
  # D=1, w = [0, log 2, log 3] / ... : z = [0, ln2, ln3] so p = [1, 2, 3] / 6.
  h = jnp.ones((1, 2, 1))
  w = jnp.log(jnp.array([[1.0, 2.0, 3.0]]))
  y = jnp.array([[1, 2]])
  got = scoring.token_logprobs_from_hidden(h, w, y, 1.0, 1)
  np.testing.assert_allclose(got, np.log([[2 / 6, 3 / 6]]), rtol=1e-6)
  # tau = 0.5 squares the odds: p = [1, 4, 9] / 14.
  got = scoring.token_logprobs_from_hidden(h, w, y, 0.5, 1)
  np.testing.assert_allclose(got, np.log([[4 / 14, 9 / 14]]), rtol=1e-6)


def test_entropy_matches_naive():
  h, w, y = _rand(1, scale=0.5)
  logp, ent = scoring.token_logprobs_and_entropy_from_hidden(h, w, y, 0.8, 5)
  logq = _naive_logq(h, w, 0.8)
  np.testing.assert_allclose(logp, _naive_logprobs(h, w, y, 0.8), atol=1e-5)
  np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(logq) * logq, -1), atol=1e-5)
  # Gradients through both outputs at once (the custom VJP's two terms).
  c = jax.random.normal(jax.random.PRNGKey(9), (2,) + y.shape)

  def loss(fn):
    return lambda h, w: jnp.sum(c[0] * fn(h, w)[0] + c[1] * fn(h, w)[1])

  def naive(h, w):
    logq = _naive_logq(h, w, 0.8)
    ent = -jnp.sum(jnp.exp(logq) * logq, -1)
    return _naive_logprobs(h, w, y, 0.8), ent

  g = _jit_grad(
      loss(
          lambda h, w: scoring.token_logprobs_and_entropy_from_hidden(
              h, w, y, 0.8, 5
          )
      ),
      (0, 1),
  )(h, w)
  g_ref = _jit_grad(loss(naive), (0, 1))(h, w)
  for a, b in zip(g, g_ref):
    np.testing.assert_allclose(a, b, atol=1e-5)
  # A uniform distribution over V has entropy log V.
  _, ent0 = scoring.token_logprobs_and_entropy_from_hidden(
      jnp.zeros_like(h), w, y, 1.0, 5
  )
  np.testing.assert_allclose(ent0, np.full(y.shape, np.log(50)), rtol=1e-6)


def test_bf16_inputs_give_float32_logits():
  h, w, y = _rand(2, d=32, v=300)
  h16, w16 = h.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  got = scoring.token_logprobs_from_hidden(h16, w16, y, 1.0, 4)
  assert got.dtype == jnp.float32
  # bf16 x bf16 products are exact in f32: only f32 summation order differs.
  ref = _naive_logprobs(h16.astype(jnp.float32), w16.astype(jnp.float32), y, 1)
  np.testing.assert_allclose(got, ref, atol=1e-4)
  # A bf16 logits array would be off by far more than that.
  z16 = jnp.einsum("btd,dv->btv", h16, w16)  # bf16 out
  bad = jnp.take_along_axis(
      jax.nn.log_softmax(z16.astype(jnp.float32)), y[..., None], -1
  )[..., 0]
  assert np.abs(np.asarray(bad - ref)).max() > 1e-3
  g = _jit_grad(
      lambda h: scoring.token_logprobs_from_hidden(h, w16, y, 1.0, 4).sum()
  )(h16)
  assert (
      g.dtype == jnp.bfloat16 and np.isfinite(np.asarray(g, np.float32)).all()
  )


def test_bad_inputs_raise():
  h, w, y = _rand(3)
  for temperature in (0.0, 1e-40, float("inf")):
    with pytest.raises(ValueError, match="temperature"):
      scoring.token_logprobs_from_hidden(h, w, y, temperature, 4)
  with pytest.raises(ValueError, match="chunk_size"):
    scoring.token_logprobs_from_hidden(h, w, y, 1.0, 0)
  with pytest.raises(ValueError, match="hidden size"):
    scoring.token_logprobs_from_hidden(h, w[:4], y, 1.0, 4)
  with pytest.raises(ValueError, match="targets"):
    scoring.token_logprobs_from_hidden(h, w, y[:, :5], 1.0, 4)
  with pytest.raises(ValueError, match="vocab sizes differ"):
    scoring.kl_from_hidden(h, w, h, w[:, :40], 1.0, 4)


# ----------------------------------------------------------------------- KL


def test_kl_matches_float64_numpy():
  # Independent computation in float64 numpy; the two sides differ in D.
  h_new, w_new, _ = _rand(4, b=2, t=7, d=6, v=11)
  h_old, w_old, _ = _rand(5, b=2, t=7, d=3, v=11)
  tau = 1.3
  got = scoring.kl_from_hidden(h_new, w_new, h_old, w_old, tau, 3)
  a = _np_log_softmax(np.asarray(h_new, np.float64) @ np.asarray(w_new) / tau)
  b = _np_log_softmax(np.asarray(h_old, np.float64) @ np.asarray(w_old) / tau)
  ref = (np.exp(a) * (a - b)).sum(-1)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
  assert (np.asarray(got) > 0).all()


def test_kl_hand_computed():
  # p = [1/2, 1/2], q = [1/4, 3/4]: KL = 1/2 ln 2 + 1/2 ln(2/3).
  h = jnp.ones((1, 1, 1))
  w_new = jnp.zeros((1, 2))
  w_old = jnp.log(jnp.array([[1.0, 3.0]]))
  got = scoring.kl_from_hidden(h, w_new, h, w_old, 1.0, 1)
  np.testing.assert_allclose(
      got, [[0.5 * np.log(2) + 0.5 * np.log(2 / 3)]], rtol=1e-6
  )


def test_kl_of_identical_models_is_zero_and_grads_match_naive():
  h, w, _ = _rand(6)
  same = np.asarray(scoring.kl_from_hidden(h, w, h, w, 0.9, 4))
  assert same.min() >= 0 and same.max() < 1e-6
  h_old, w_old, _ = _rand(7)
  c = jax.random.normal(jax.random.PRNGKey(8), h.shape[:2])
  # All four inputs: the old side's cotangent is q - p.
  got = _jit_grad(
      lambda *a: jnp.sum(c * scoring.kl_from_hidden(*a, 0.9, 5)),
      (0, 1, 2, 3),
  )(h, w, h_old, w_old)
  ref = _jit_grad(lambda *a: jnp.sum(c * _naive_kl(*a, 0.9)), (0, 1, 2, 3))(
      h, w, h_old, w_old
  )
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  # At p_new == p_old the KL is at its minimum: zero gradient.
  g0 = _jit_grad(lambda h: scoring.kl_from_hidden(h, w, h, w, 1.0, 4).sum())(h)
  np.testing.assert_allclose(g0, np.zeros_like(g0), atol=1e-6)


def _np_peaked(seed, scale):
  """Random h, w (scaled: peaked softmax), targets and cotangents, numpy."""
  rng = np.random.default_rng(seed)
  h = rng.standard_normal((2, 9, 16)).astype(np.float32)
  w = (scale * rng.standard_normal((16, 300))).astype(np.float32)
  y = rng.integers(0, 300, (2, 9))
  c = rng.standard_normal((2, 2, 9)).astype(np.float32)
  return h, w, y, c


def _np_log_softmax64(x):
  x = x.astype(np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_backprop64(dz, h, w):
  return dz @ w.T.astype(np.float64), np.einsum("btd,btv->dv", h, dz)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_peaked_gradients_as_accurate_as_naive_float32(scale):
  # Independent float64 gradients in numpy (closed form): d logp / dz =
  # onehot - p, d H / dz = -p (log p + H), d KL / dz = p (log p - log q -
  # KL). At scale 30 the top token has p ~ 0.97: a formula that subtracts
  # large logits (z - E_p[z], z - y - E_p[z - y]) loses 2-3 digits there.
  h, w, y, c = _np_peaked(0, scale)
  h_old, w_old, _, _ = _np_peaked(1, 1.0)
  logq = _np_log_softmax64(h.astype(np.float64) @ w)
  p = np.exp(logq)
  ent = -(p * logq).sum(-1)
  dz = c[0][..., None] * (np.eye(300)[y] - p)
  dz -= c[1][..., None] * p * (logq + ent[..., None])
  ref = _np_backprop64(dz, h, w)

  def loss(h, w):
    lp, e = scoring.token_logprobs_and_entropy_from_hidden(h, w, y, 1.0, 4)
    return jnp.sum(c[0] * lp + c[1] * e)

  def naive(h, w):
    lq = jax.nn.log_softmax(h @ w)
    lp = jnp.take_along_axis(lq, y[..., None], -1)[..., 0]
    return jnp.sum(c[0] * lp - c[1] * jnp.sum(jnp.exp(lq) * lq, -1))

  got, base = _jit_grad(loss, (0, 1))(h, w), _jit_grad(naive, (0, 1))(h, w)
  for g, b, r in zip(got, base, ref):
    assert np.abs(g - r).max() <= 2 * np.abs(b - r).max() + 1e-5

  logq_old = _np_log_softmax64(h_old.astype(np.float64) @ w_old)
  d = logq - logq_old
  kl = (p * d).sum(-1)
  ref = _np_backprop64(c[0][..., None] * p * (d - kl[..., None]), h, w)
  got = _jit_grad(
      lambda h, w: jnp.sum(
          c[0] * scoring.kl_from_hidden(h, w, h_old, w_old, 1.0, 4)
      ),
      (0, 1),
  )(h, w)
  base = _jit_grad(
      lambda h, w: jnp.sum(c[0] * _naive_kl(h, w, h_old, w_old, 1.0)), (0, 1)
  )(h, w)
  for g, b, r in zip(got, base, ref):
    assert np.abs(g - r).max() <= 2 * np.abs(b - r).max() + 1e-5
  np.testing.assert_allclose(
      scoring.kl_from_hidden(h, w, h_old, w_old, 1.0, 4), kl, rtol=1e-5
  )


# ------------------------------------------------------------------- memory


def _temp_bytes(fn, *shapes):
  return (
      jax.jit(fn).lower(*shapes).compile().memory_analysis().temp_size_in_bytes
  )


def test_no_full_logits_buffer_in_compiled_forward_or_backward():
  b, t, d, v, chunk = 2, 512, 64, 32768, 64
  full = b * t * v * 4  # one [B, T, V] f32 array: 128 MiB.
  h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
  w = jax.ShapeDtypeStruct((d, v), jnp.float32)
  y = jax.ShapeDtypeStruct((b, t), jnp.int32)

  def lp(h, w, y):
    return scoring.token_logprobs_from_hidden(h, w, y, 1.0, chunk).sum()

  def kl(h, w, y):
    del y
    return scoring.kl_from_hidden(h, w, 0.5 * h, w, 1.0, chunk).sum()

  def naive(h, w, y):
    return _naive_logprobs(h, w, y, 1.0).sum()

  # The measurement sees a [B, T, V] buffer when there is one.
  assert _temp_bytes(naive, h, w, y) >= full
  # Chunked: one [B, chunk, V] f32 buffer is 1/8 of [B, T, V]. Log-probs
  # hold one (forward) or two (backward: logits and their cotangent), the KL
  # two (new and old logits) or four (and both cotangents; here the old side
  # 0.5 h is differentiated too), besides the float32 [D, V] gradient
  # accumulators (1/16 of [B, T, V] each at this size).
  assert _temp_bytes(lp, h, w, y) < 0.15 * full
  assert _temp_bytes(jax.grad(lp, (0, 1)), h, w, y) < 0.3 * full
  assert _temp_bytes(kl, h, w, y) < 0.3 * full
  assert _temp_bytes(jax.grad(kl, (0, 1)), h, w, y) < 0.65 * full


# ----------------------------------------------------------------- sharding


def test_sharded_matches_unsharded():
  mesh = jax.make_mesh(
      (2, 4), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2
  )
  h, w, y = _rand(10, b=4, t=9, d=8, v=64)
  h_old, w_old, _ = _rand(11, b=4, t=9, d=8, v=64)
  ref_lp = scoring.token_logprobs_from_hidden(h, w, y, 1.0, 4)
  ref_kl = scoring.kl_from_hidden(h, w, h_old, w_old, 1.0, 4)
  spec = jax.sharding.PartitionSpec
  with jax.set_mesh(mesh):
    h_s = jax.device_put(h, spec("data"))
    w_s = jax.device_put(w, spec(None, "tensor"))
    y_s = jax.device_put(y, spec("data"))
    lp = jax.jit(scoring.token_logprobs_from_hidden, static_argnums=(3, 4))(
        h_s, w_s, y_s, 1.0, 4
    )
    kl = jax.jit(scoring.kl_from_hidden, static_argnums=(4, 5))(
        h_s, w_s, h_old, w_old, 1.0, 4
    )
  np.testing.assert_allclose(lp, ref_lp, atol=1e-5)
  np.testing.assert_allclose(kl, ref_kl, atol=1e-5)


# -------------------------------------------------------------- model level

_TINY = models.get_preset("qwen3-tiny")


def _tokens_and_mask(config, b=3, t=11, seed=0):
  tokens = jax.random.randint(
      jax.random.PRNGKey(seed), (b, t), 0, config.vocab_size
  )
  mask = np.ones((b, t), np.int32)
  mask[1, :3] = 0  # left padding
  mask[2, -4:] = 0  # right padding
  return tokens, jnp.asarray(mask)


def _naive_model_logprobs(config, params, tokens, mask, tau):
  logits = models.forward(config, params, tokens, mask).astype(jnp.float32)
  logq = jax.nn.log_softmax(logits / tau, axis=-1)
  out = jnp.take_along_axis(logq[:, :-1], tokens[:, 1:, None], -1)[..., 0]
  return jnp.pad(out, ((0, 0), (1, 0))) * scoring._state_mask(mask)


def _naive_model_kl(cfg_new, p_new, cfg_old, p_old, tokens, mask, tau):
  a = jax.nn.log_softmax(models.forward(cfg_new, p_new, tokens, mask) / tau)
  b = jax.nn.log_softmax(models.forward(cfg_old, p_old, tokens, mask) / tau)
  kl = jnp.sum(jnp.exp(a) * (a - b), -1)[:, :-1]
  return jnp.pad(kl, ((0, 0), (1, 0))) * scoring._state_mask(mask)


def test_state_mask_positions():
  mask = jnp.array([[1, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1]])
  np.testing.assert_array_equal(
      scoring._state_mask(mask),
      [[0, 1, 1, 1], [0, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]],
  )


def _values_and_grads(fn, params, weights_BxT):
  """(fn(params), grad of sum(weights * fn)) from one jitted computation."""

  def loss(p):
    out = fn(p)
    return jnp.sum(weights_BxT * out), out

  (_, out), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return out, g


def test_model_token_logprobs_match_naive_values_and_grads():
  params = models.init_params(_TINY, jax.random.PRNGKey(1))
  tokens, mask = _tokens_and_mask(_TINY)
  tau = 0.8
  # Weights differ per position, so that a mix-up between positions shows.
  weights = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
  got, g = _values_and_grads(
      lambda p: scoring.token_logprobs(
          _TINY, p, tokens, mask, tau, chunk_size=4, remat=True
      ),
      params,
      weights,
  )
  ref, g_ref = _values_and_grads(
      lambda p: _naive_model_logprobs(_TINY, p, tokens, mask, tau),
      params,
      weights,
  )
  np.testing.assert_allclose(got, ref, atol=1e-5)
  valid = np.asarray(scoring._state_mask(mask)) == 1
  assert np.all(np.asarray(got)[~valid] == 0)
  assert np.all(np.asarray(got)[valid] < 0)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
      g,
      g_ref,
  )


def test_model_entropy_matches_naive():
  params = models.init_params(_TINY, jax.random.PRNGKey(2))
  tokens, mask = _tokens_and_mask(_TINY)
  logp, ent = scoring.token_logprobs_and_entropy(
      _TINY, params, tokens, mask, 1.0, chunk_size=5
  )
  logq = jax.nn.log_softmax(models.forward(_TINY, params, tokens, mask))
  ref = jnp.pad(-jnp.sum(jnp.exp(logq) * logq, -1)[:, :-1], ((0, 0), (1, 0)))
  np.testing.assert_allclose(ent, ref * scoring._state_mask(mask), atol=1e-5)
  np.testing.assert_allclose(
      logp, scoring.token_logprobs(_TINY, params, tokens, mask), atol=1e-6
  )


def test_model_state_kl_across_architectures_and_grads():
  # The old model is a different architecture with the same vocabulary.
  cfg_old = _TINY.replace(hidden_size=32, num_layers=1, mlp_dim=64)
  p_new = models.init_params(_TINY, jax.random.PRNGKey(3))
  p_old = models.init_params(cfg_old, jax.random.PRNGKey(4))
  tokens, mask = _tokens_and_mask(_TINY)
  tau = 1.5
  # Random N(0, 0.02) weights give near-uniform p; scale the output layer
  # up so that the KL is far from zero.
  p_new = dict(p_new, embed=p_new["embed"] * 50)
  weights = jax.random.normal(jax.random.PRNGKey(5), tokens.shape)
  got, g = _values_and_grads(
      lambda p: scoring.state_kl(
          _TINY, p, cfg_old, p_old, tokens, mask, tau, 4
      ),
      p_new,
      weights,
  )
  ref, g_ref = _values_and_grads(
      lambda p: _naive_model_kl(_TINY, p, cfg_old, p_old, tokens, mask, tau),
      p_new,
      weights,
  )
  np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
  valid = np.asarray(scoring._state_mask(mask)) == 1
  assert np.all(np.asarray(got)[valid] > 1e-3)
  assert np.all(np.asarray(got)[~valid] == 0)
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
      g,
      g_ref,
  )
  same = scoring.state_kl(_TINY, p_new, _TINY, p_new, tokens, mask, tau, 4)
  assert np.asarray(same).min() >= 0 and np.asarray(same).max() < 1e-6


def test_fused_logprobs_and_kl_equal_the_separate_kernels():
  p_new = models.init_params(_TINY, jax.random.PRNGKey(3))
  p_new = dict(p_new, embed=p_new["embed"] * 50)  # far from uniform
  p_old = models.init_params(_TINY, jax.random.PRNGKey(4))
  tokens, mask = _tokens_and_mask(_TINY)
  tau = 0.8
  w_logp = jax.random.normal(jax.random.PRNGKey(5), tokens.shape)
  w_kl = jax.random.normal(jax.random.PRNGKey(6), tokens.shape)

  def fused(p):
    logp, kl = scoring.token_logprobs_and_state_kl(
        _TINY, p, p_old, tokens, mask, tau, 4
    )
    return jnp.sum(w_logp * logp + w_kl * kl), (logp, kl)

  def separate(p):
    logp = scoring.token_logprobs(_TINY, p, tokens, mask, tau, 4)
    kl = scoring.state_kl(_TINY, p, _TINY, p_old, tokens, mask, tau, 4)
    return jnp.sum(w_logp * logp + w_kl * kl), (logp, kl)

  (_, got), g = jax.value_and_grad(fused, has_aux=True)(p_new)
  (_, ref), g_ref = jax.value_and_grad(separate, has_aux=True)(p_new)
  for a, b in zip(got, ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert np.asarray(got[1]).max() > 1e-3  # the KL term is not trivially 0
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      g,
      g_ref,
  )


def test_model_state_kl_rejects_different_vocabularies():
  cfg_old = _TINY.replace(vocab_size=_TINY.vocab_size + 1)
  tokens, mask = _tokens_and_mask(_TINY)
  with pytest.raises(ValueError, match="vocab_size 512 .new. and 513"):
    scoring.state_kl(
        _TINY,
        models.param_shapes(_TINY),
        cfg_old,
        models.param_shapes(cfg_old),
        tokens,
        mask,
    )


def test_model_logprobs_match_pytorch_transformers(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen3Config(
      vocab_size=256,
      hidden_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      intermediate_size=128,
      tie_word_embeddings=True,
  )
  model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
  with torch.no_grad():  # sharper than the N(0, 0.02) init: larger log-probs
    model.model.embed_tokens.weight.mul_(20)
  model.save_pretrained(tmp_path)
  config, params = models.load_hf(tmp_path)
  tokens = np.random.default_rng(0).integers(0, 256, (2, 9))
  with torch.no_grad():
    logits = model(torch.as_tensor(tokens)).logits.double()
  logq = torch.log_softmax(logits / 0.7, -1)[:, :-1]
  ref = torch.gather(logq, -1, torch.as_tensor(tokens[:, 1:, None]))[..., 0]
  got = scoring.token_logprobs(
      config, params, jnp.asarray(tokens), jnp.ones((2, 9), jnp.int32), 0.7, 4
  )
  assert np.all(np.asarray(got[:, 0]) == 0)
  np.testing.assert_allclose(got[:, 1:], ref.numpy(), atol=1e-4)
  assert ref.numpy().std() > 0.1  # not a flat distribution


# --------------------------------------------------- selected positions only


def test_action_positions_hand_computed():
  selected = np.zeros((3, 40), bool)
  selected[0, [2, 3, 7]] = True
  selected[1, 5:25] = True  # 20 positions: A rounds up to 32
  got = scoring.action_positions(selected)
  assert got.shape == (3, 32) and got.dtype == np.int32
  np.testing.assert_array_equal(got[0], [2, 3, 7] + [0] * 29)
  np.testing.assert_array_equal(got[1], list(range(5, 25)) + [0] * 12)
  np.testing.assert_array_equal(got[2], [0] * 32)  # a row with none
  np.testing.assert_array_equal(
      scoring.action_positions(selected, multiple=4)[1, :20], range(5, 25)
  )
  assert scoring.action_positions(selected, multiple=4).shape == (3, 20)
  # A fixed capacity when every row fits, else the rounded-up count.
  assert scoring.action_positions(selected, capacity=24).shape == (3, 24)
  np.testing.assert_array_equal(
      scoring.action_positions(selected, capacity=24)[1, 19:], [24] + [0] * 4
  )
  assert scoring.action_positions(selected, capacity=19).shape == (3, 32)
  # A would reach T: no positions (the full pass costs the same).
  assert scoring.action_positions(selected[:, :30]) is None
  assert scoring.action_positions(selected, capacity=40) is None
  with pytest.raises(ValueError, match="position 0 has no state"):
    scoring.action_positions(np.eye(3, 40, dtype=bool))
  with pytest.raises(ValueError, match="not .B, T."):
    scoring.action_positions(np.zeros(5, bool))


def _selected_positions(mask, seed=0):
  """A random subset of each row's scored states, and its positions_BxA."""
  rng = np.random.default_rng(seed)
  state = np.asarray(scoring._state_mask(mask)) > 0
  selected = state & (rng.random(state.shape) < 0.5)
  selected[0] = state[0]  # one row with every state (no unused slot)
  positions = scoring.action_positions(selected, multiple=1)
  assert positions is not None and positions.shape[1] < mask.shape[1]
  return selected, jnp.asarray(positions)


def test_positions_give_the_full_values_there_and_zero_elsewhere():
  # The same values and gradients as the full pass at the selected
  # positions, for every model-level wrapper.
  cfg_old = _TINY.replace(hidden_size=32, num_layers=1, mlp_dim=64)
  p_new = models.init_params(_TINY, jax.random.PRNGKey(3))
  # Far from uniform (a KL well above 0) but not one-hot (an entropy too).
  p_new = dict(p_new, embed=p_new["embed"] * 8)
  p_old = models.init_params(_TINY, jax.random.PRNGKey(4))
  p_old_other = models.init_params(cfg_old, jax.random.PRNGKey(5))
  tokens, mask = _tokens_and_mask(_TINY, b=3, t=11)
  mask = mask.at[0, -1].set(0)  # every row padded: row 0 still has 9 states
  selected, positions = _selected_positions(mask)
  weights = jnp.asarray(selected) * jax.random.normal(
      jax.random.PRNGKey(6), tokens.shape
  )
  tau = 0.8

  def fns(pos):
    return {
        "logp": lambda p: scoring.token_logprobs(
            _TINY, p, tokens, mask, tau, 4, positions_BxA=pos
        ),
        "entropy": lambda p: scoring.token_logprobs_and_entropy(
            _TINY, p, tokens, mask, tau, 4, positions_BxA=pos
        )[1],
        "kl": lambda p: scoring.state_kl(
            _TINY, p, cfg_old, p_old_other, tokens, mask, tau, 4,
            positions_BxA=pos,
        ),
        "fused": lambda p: sum(
            scoring.token_logprobs_and_state_kl(
                _TINY, p, p_old, tokens, mask, tau, 4, positions_BxA=pos
            )
        ),
    }  # fmt: skip

  full, at = fns(None), fns(positions)
  for name in full:
    ref, g_ref = _values_and_grads(full[name], p_new, weights)
    got, g = _values_and_grads(at[name], p_new, weights)
    np.testing.assert_allclose(
        np.asarray(got)[selected], np.asarray(ref)[selected], atol=1e-5
    )
    assert np.all(np.abs(np.asarray(ref)[selected]) > 1e-4), name
    assert np.all(np.asarray(got)[~selected] == 0), name
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
        g,
        g_ref,
    )


def test_positions_are_checked():
  tokens, mask = _tokens_and_mask(_TINY)
  shapes = models.param_shapes(_TINY)
  with pytest.raises(ValueError, match="positions .2, 3. are not .B=3, A."):
    scoring.token_logprobs(
        _TINY, shapes, tokens, mask, positions_BxA=jnp.ones((2, 3), jnp.int32)
    )
  with pytest.raises(ValueError, match="12 positions per row exceed T=11"):
    scoring.state_kl(
        _TINY, shapes, _TINY, shapes, tokens, mask,
        positions_BxA=jnp.ones((3, 12), jnp.int32),
    )  # fmt: skip


def test_padding_ids_outside_the_vocabulary_change_nothing():
  # Ids at padding (mask 0) are arbitrary: ids outside [0, V) there give
  # exactly the values and gradients of id 0, for every model-level
  # wrapper, with and without positions, and those match the naive
  # reference. (They used to gather NaN embeddings and targets, which
  # reached every position through the masked keys' values: 0 * NaN.)
  p_new = models.init_params(_TINY, jax.random.PRNGKey(3))
  p_new = dict(p_new, embed=p_new["embed"] * 8)
  p_old = models.init_params(_TINY, jax.random.PRNGKey(4))
  tokens, mask = _tokens_and_mask(_TINY)
  clean = jnp.where(mask > 0, tokens, 0)
  _, positions = _selected_positions(mask)
  weights = jax.random.normal(jax.random.PRNGKey(6), tokens.shape)
  tau = 0.8

  def all_values(p, tok, mask):
    out = {}
    for name, pos in (("", None), ("at ", positions)):
      logp, ent = scoring.token_logprobs_and_entropy(
          _TINY, p, tok, mask, tau, 4, positions_BxA=pos
      )
      out[name + "logp"] = logp
      out[name + "entropy"] = ent
      out[name + "kl"] = scoring.state_kl(
          _TINY, p, _TINY, p_old, tok, mask, tau, 4, positions_BxA=pos
      )
      out[name + "fused logp"], out[name + "fused kl"] = (
          scoring.token_logprobs_and_state_kl(
              _TINY, p, p_old, tok, mask, tau, 4, positions_BxA=pos
          )
      )
      out[name + "reference"] = scoring.kl_reference_hidden(
          _TINY, p_old, tok, mask, positions_BxA=pos
      )
    return out

  def loss(p, tok, mask):
    out = all_values(p, tok, mask)
    scored = [v for k, v in out.items() if "reference" not in k]
    return sum(jnp.sum(weights * v) for v in scored), out

  # The mask an argument, as in training: a constant one would let XLA
  # fold the NaN * 0 at padding away.
  run = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (_, ref), g_ref = run(p_new, clean, mask)
  np.testing.assert_allclose(
      ref["logp"],
      _naive_model_logprobs(_TINY, p_new, clean, mask, tau),
      atol=1e-5,
  )
  np.testing.assert_allclose(
      ref["kl"],
      _naive_model_kl(_TINY, p_new, _TINY, p_old, clean, mask, tau),
      rtol=1e-4,
      atol=1e-6,
  )
  for pad in (-1, _TINY.vocab_size, 10**6):
    (_, got), g = run(p_new, jnp.where(mask > 0, tokens, pad), mask)
    for name in ref:
      np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    jax.tree.map(np.testing.assert_array_equal, g, g_ref)
  # Op by op too, where no compiler rewrites the 0 * NaN at padding.
  eager = scoring.token_logprobs_and_state_kl(
      _TINY, p_new, p_old, jnp.where(mask > 0, tokens, 10**6), mask, tau, 4
  )
  np.testing.assert_allclose(eager[0], ref["fused logp"], atol=1e-6)
  np.testing.assert_allclose(eager[1], ref["fused kl"], atol=1e-6)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(g_ref))
