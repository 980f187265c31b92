"""Fitting a model into the trust region by distilling the projection."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sat_jax import models
from sat_jax import scoring
from sat_jax import testing
from sat_jax.stage0 import fit as fit_lib

_PRE = testing.tiny_config("qwen3")
_CUR = testing.tiny_config("qwen3", num_layers=1, hidden_size=48, mlp_dim=96)


@functools.lru_cache(maxsize=None)
def _params(which: str):
  config, seed = (_PRE, 1) if which == "pre" else (_CUR, 2)
  init = jax.jit(lambda k: models.init_params(config, k))
  params = init(jax.random.key(seed))
  return jax.tree.map(lambda x: x * 4 if x.ndim >= 2 else x, params)


def _draw_states(key):
  """16 streams of 24 tokens; the last 12 positions are the agent's own.

  Always the same streams (the key is unused): random tokens have nothing
  to generalise from, so the fit is checked on the states it trains on.
  """
  del key
  tokens = jax.random.randint(
      jax.random.key(7), (16, 24), 0, _PRE.vocab_size, jnp.int32
  )
  mask = jnp.ones((16, 24), jnp.int32)
  own = jnp.zeros((16, 24), bool).at[:, 12:].set(True)
  return fit_lib.States(tokens, mask, own)


def _quantile(params, states, q):
  kl = scoring.state_kl(
      _PRE, params, _CUR, _params("cur"), states.tokens_ExT, states.mask_ExT
  )
  own = np.asarray(kl)[np.asarray(states.own_ExT)]
  return float(np.quantile(own, q, method="inverted_cdf"))


def test_fit_enters_the_trust_region():
  held = _draw_states(None)
  start = _quantile(_params("pre"), held, 0.9)
  delta0 = 0.3 * start  # pi_pre itself is far outside
  cfg = fit_lib.FitConfig(
      delta0=delta0, quantile=0.9, learning_rate=1e-2, max_steps=80
  )
  result = fit_lib.fit(
      cfg,
      fit_lib.Model(_PRE, _params("pre")),
      fit_lib.Model(_CUR, _params("cur")),
      _draw_states,
      jax.random.key(5),
  )
  assert result.inside and 0 < result.steps < 80
  np.testing.assert_allclose(result.history[0]["kl_quantile"], start, rtol=1e-4)
  # An independent check of the monitor on the returned params.
  end = _quantile(result.params, held, 0.9)
  np.testing.assert_allclose(result.history[-1]["kl_quantile"], end, rtol=1e-4)
  assert end <= delta0
  losses = [r["loss"] for r in result.history[1:]]
  assert losses[-1] < 0.5 * losses[0]


def test_a_model_already_inside_is_returned_unchanged():
  cfg = fit_lib.FitConfig(delta0=1e3)
  result = fit_lib.fit(
      cfg,
      fit_lib.Model(_PRE, _params("pre")),
      fit_lib.Model(_CUR, _params("cur")),
      _draw_states,
      jax.random.key(0),
  )
  assert result.inside and result.steps == 0 and len(result.history) == 1
  assert result.params is _params("pre")


@pytest.mark.parametrize(
    "field,value", [("delta0", -1.0), ("quantile", 1.0), ("max_steps", -1)]
)
def test_bad_fit_config_names_the_field(field, value):
  kwargs = {"delta0": 0.1, field: value}
  with pytest.raises(ValueError, match=field):
    fit_lib.FitConfig(**kwargs)
