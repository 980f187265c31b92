"""Tabular softmax agents: one row of logits per information state.

A `TabularAgent` implements the SAT agent protocol exactly: its inputs are
{"state": int_ExT, "action": int_ExT} (rows of its own table and actions),
`token_logprobs` is log softmax(logits[state])[action] and `state_kl` is the
exact KL between the two softmax rows of the state, summed over all actions.
Indices are clipped into range because positions where another agent acts
may carry that agent's ids; the team batch masks them out.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class TabularAgent:
  """pi(a|s) = softmax(logits_SxA[s])_a over `num_actions` actions."""

  num_states: int
  num_actions: int

  def __post_init__(self):
    if self.num_states < 1 or self.num_actions < 1:
      raise ValueError(
          "TabularAgent needs num_states >= 1 and num_actions >= 1, got "
          f"{self.num_states} x {self.num_actions}"
      )

  def init_params(self, logits=None) -> jax.Array:
    """float32 logits_SxA: zeros (uniform policy) or the given values."""
    shape = (self.num_states, self.num_actions)
    if logits is None:
      logits = np.zeros(shape, np.float32)
    logits = np.asarray(jax.device_get(logits), np.float32)
    if logits.shape != shape:
      raise ValueError(f"logits shape {logits.shape} != {shape}")
    return jax.device_put(logits)

  def _index(self, inputs):
    state = jnp.clip(inputs["state"], 0, self.num_states - 1)
    action = jnp.clip(inputs["action"], 0, self.num_actions - 1)
    return state, action

  def token_logprobs(self, params: jax.Array, inputs) -> jax.Array:
    state, action = self._index(inputs)
    return jax.nn.log_softmax(params, axis=-1)[state, action]

  def state_kl(self, params_new, params_old, inputs) -> jax.Array:
    state, _ = self._index(inputs)
    return self.kl_per_state(params_new, params_old)[state]

  @staticmethod
  def kl_per_state(params_new, params_old) -> jax.Array:
    """KL(softmax(new[s]) || softmax(old[s])) for every row s: kl_S."""
    logp_new = jax.nn.log_softmax(params_new, axis=-1)
    logp_old = jax.nn.log_softmax(params_old, axis=-1)
    return jnp.sum(jnp.exp(logp_new) * (logp_new - logp_old), axis=-1)

  def sample(self, params, state_E, key) -> tuple[jax.Array, jax.Array]:
    """Draws a ~ pi(.|s) per episode; returns (action_E, logp_E)."""
    action_E = jax.random.categorical(key, params[state_E], axis=-1)
    # The behaviour log-prob is computed exactly as the trainer recomputes it.
    logp_E = self.token_logprobs(params, {"state": state_E, "action": action_E})
    return action_E, logp_E
