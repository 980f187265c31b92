"""The product-of-experts sampler against teacher-forced projections."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax import models
from sat_jax import sampling
from sat_jax import testing
from sat_jax.stage0 import product
from sat_jax.stage0 import projection

# Two different architectures over one vocabulary.
_PRE = testing.tiny_config("qwen3")
_CUR = testing.tiny_config("qwen3", num_layers=1, hidden_size=48, mlp_dim=96)
_PROMPTS = [[5, 17, 99], [3, 250, 42, 7, 7, 300, 12, 1, 2, 3], [100]]
_OPTIONS = sampling.SamplingOptions(
    max_new_tokens=6, temperature=0.8, prompt_buckets=(16,)
)
_forward = jax.jit(models.forward, static_argnums=0)


@functools.lru_cache(maxsize=None)
def _params(which: str):
  config, seed = (_PRE, 1) if which == "pre" else (_CUR, 2)

  @jax.jit
  def init(key):
    params = models.init_params(config, key)
    return jax.tree.map(lambda x: x * 5 if x.ndim >= 3 else x, params)

  return init(jax.random.key(seed))


def _sample(delta0, options=_OPTIONS, key=jax.random.key(3)):
  tokens, mask = sampling.pad_prompts(_PROMPTS, options)
  out = product.sample(
      _PRE,
      _params("pre"),
      _CUR,
      _params("cur"),
      tokens,
      mask,
      options,
      delta0,
      key,
  )
  return tokens, mask, out


def _teacher_forced(config, params, tokens, mask, out):
  full = np.concatenate([tokens, out.tokens_BxN], 1)
  full_mask = np.concatenate([mask, out.mask_BxN], 1)
  logits = _forward(config, params, full, full_mask)
  return logits[:, tokens.shape[1] - 1 : -1]


def test_logprobs_equal_the_teacher_forced_projection():
  delta0 = 0.01  # the two models are ~0.034 nats apart here
  tokens, mask, out = _sample(delta0)
  pre = _teacher_forced(_PRE, _params("pre"), tokens, mask, out)
  cur = _teacher_forced(_CUR, _params("cur"), tokens, mask, out)
  proj = projection.project_logits(pre, cur, delta0, _OPTIONS.temperature)
  want = jnp.take_along_axis(proj.log_probs, out.tokens_BxN[..., None], -1)
  m = np.asarray(out.mask_BxN, bool)
  assert m.sum() > 10
  np.testing.assert_allclose(
      np.asarray(out.logprobs_BxN)[m], np.asarray(want[..., 0])[m], atol=1e-5
  )
  # Every state of the sample is inside the ball, and most are on its edge.
  assert float(jnp.max(jnp.where(m, proj.kl, 0.0))) <= delta0 + 1e-6
  assert float(jnp.mean(proj.beta[m] < 1)) > 0.5


@pytest.mark.parametrize("which,delta0", [("pre", 1e6), ("cur", 0.0)])
def test_the_ends_of_the_ball_sample_one_model(which, delta0):
  tokens, mask, out = _sample(delta0)
  config = _PRE if which == "pre" else _CUR
  ref = sampling.sample(
      config, _params(which), tokens, mask, _OPTIONS, jax.random.key(3)
  )
  np.testing.assert_array_equal(out.tokens_BxN, ref.tokens_BxN)
  np.testing.assert_array_equal(out.mask_BxN, ref.mask_BxN)
  np.testing.assert_allclose(out.logprobs_BxN, ref.logprobs_BxN, atol=1e-5)


def test_greedy_is_the_argmax_of_the_projection():
  options = dataclasses.replace(_OPTIONS, temperature=0.0)
  tokens, mask, out = _sample(0.01, options)
  pre = _teacher_forced(_PRE, _params("pre"), tokens, mask, out)
  cur = _teacher_forced(_CUR, _params("cur"), tokens, mask, out)
  proj = projection.project_logits(pre, cur, 0.01, 1.0)
  np.testing.assert_array_equal(out.tokens_BxN, jnp.argmax(proj.log_probs, -1))


def test_vocabularies_must_match():
  other = testing.tiny_config("qwen3", vocab_size=_PRE.vocab_size + 1)
  tokens, mask = sampling.pad_prompts(_PROMPTS, _OPTIONS)
  with pytest.raises(ValueError, match="equal vocabularies"):
    product.sample(
        _PRE, None, other, None, tokens, mask, _OPTIONS, 0.1, jax.random.key(0)
    )
  with pytest.raises(ValueError, match="delta0=-1"):
    product.sample(
        _PRE, None, _PRE, None, tokens, mask, _OPTIONS, -1, jax.random.key(0)
    )
