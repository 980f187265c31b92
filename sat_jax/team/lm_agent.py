"""The LM agent: a language model as an agent of the SAT core.

`LMAgent` implements `sat_jax.core.agent.Agent` for one decoder LM. Its
inputs, for the E episodes of a batch, are the agent's own rendering of every
episode (see `transcript.py`):

  inputs = {
      "tokens_ExT": int32 [E, T]: the agent's token stream of each episode
          (context it was shown and the tokens it sampled), right-padded;
      "mask_ExT":   int32 [E, T]: 1 on real tokens, 0 on padding,
      "positions_ExA": optional int32 [E, A]: the positions of the agent's
          own tokens (`scoring.action_positions`; 0 in unused slots),
  }

Position t of an output is the *action position* (`sat_jax.scoring`): it
scores token t given tokens[:t], i.e. the state s_t is the whole prefix.
The team batch's `AgentView.mask_ExT` selects the agent's own sampled tokens
among them. With "positions_ExA" the output head runs at those positions
only and the outputs are 0 elsewhere, which the core never reads (it masks
with the view's own-token mask). Both methods run at the agent's training
temperature tau, the temperature its rollouts sample at (DESIGN §3):

  token_logprobs:  log softmax(z(tokens[:t]) / tau)[tokens[t]]
  state_kl:        KL(softmax(z_new / tau) || softmax(z_old / tau)) at s_t,
                   exact over the vocabulary, computed in chunks of
                   `chunk_size` positions (never a [E, T, V] array).
"""

import dataclasses
from typing import Any

import jax

from sat_jax import models
from sat_jax import scoring

PyTree = Any


@dataclasses.dataclass(frozen=True)
class LMAgent:
  """A decoder LM agent (hashable: a static argument of the core's jits).

  Attributes:
    config: the model's architecture.
    temperature: tau of rollouts and scoring (> 0).
    chunk_size: positions per logits chunk in scoring.
    remat: recompute each layer in the backward pass (less memory).
  """

  config: models.ModelConfig
  temperature: float = 1.0
  chunk_size: int = scoring.DEFAULT_CHUNK_SIZE
  remat: bool = False

  def __post_init__(self):
    if not isinstance(self.config, models.ModelConfig):
      raise TypeError(
          f"LMAgent.config must be a ModelConfig, got {type(self.config)}"
      )
    if self.temperature == 0:
      raise ValueError(
          "LMAgent.temperature=0 must be > 0 (training samples at it; greedy"
          " decoding has no scored distribution)"
      )
    scoring.check_temperature(self.temperature, "LMAgent.temperature")
    if not isinstance(self.chunk_size, int) or self.chunk_size < 1:
      raise ValueError(f"LMAgent.chunk_size={self.chunk_size} must be >= 1")

  def token_logprobs(self, params: PyTree, inputs: PyTree) -> jax.Array:
    """logp_ExT of each token given its prefix (module docstring)."""
    return scoring.token_logprobs(
        self.config,
        params,
        inputs["tokens_ExT"],
        inputs["mask_ExT"],
        self.temperature,
        self.chunk_size,
        remat=self.remat,
        positions_BxA=inputs.get("positions_ExA"),
    )

  def kl_reference(self, params_old: PyTree, inputs: PyTree) -> jax.Array:
    """h_old_ExSxD: the old model's hidden states at the scored states.

    What the KL needs of params_old besides its output matrix; the core
    computes it once per update try instead of once per minibatch step
    and holds it through the try: E x A x D in the param dtype (A: the
    own-token positions, else T), sharded over the batch like the view.
    """
    return scoring.kl_reference_hidden(
        self.config,
        jax.lax.stop_gradient(params_old),
        inputs["tokens_ExT"],
        inputs["mask_ExT"],
        positions_BxA=inputs.get("positions_ExA"),
    )

  def logprobs_and_kl(
      self,
      params_new: PyTree,
      params_old: PyTree,
      inputs: PyTree,
      reference: jax.Array | None = None,
  ) -> tuple[jax.Array, jax.Array]:
    """(token_logprobs, state_kl) with one body pass on params_new.

    With `reference` (`kl_reference(params_old, inputs)`) no pass on
    params_old at all.
    """
    return scoring.token_logprobs_and_state_kl(
        self.config,
        params_new,
        jax.lax.stop_gradient(params_old),
        inputs["tokens_ExT"],
        inputs["mask_ExT"],
        self.temperature,
        self.chunk_size,
        remat=self.remat,
        positions_BxA=inputs.get("positions_ExA"),
        reference_hidden=(
            None if reference is None else jax.lax.stop_gradient(reference)
        ),
    )

  def state_kl(
      self, params_new: PyTree, params_old: PyTree, inputs: PyTree
  ) -> jax.Array:
    """kl_ExT: exact KL(pi_new(.|s_t) || pi_old(.|s_t)) per position.

    The fused pass's KL: under jit (where the core calls it) XLA drops the
    unused log-prob head, so this costs what a KL-only kernel would.
    """
    return self.logprobs_and_kl(params_new, params_old, inputs)[1]
