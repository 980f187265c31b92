"""The Stage-0 product-of-experts agent at decoding time (DESIGN §5 (a)).

Samples from the projected policy pi_new of `projection.py` without
training anything: both models (pi_pre, the stronger one, and pi_cur, the
agent it replaces) run side by side with their own KV caches; at each step
their logits at the agent's temperature tau give pi_new by the per-state
bisection, and the token is drawn from pi_new. The returned log-probs are
those of pi_new (after top-k / top-p, when the options ask for them), so a
teacher-forced recomputation with `projection.project_logits` on the two
models' full forward logits gives the same values.

    out = product.sample(pre_config, pre_params, cur_config, cur_params,
                         tokens_BxP, mask_BxP, options, delta0, key)

The two models must share the vocabulary (the same tokenizer); they may
differ in everything else. One compile per (configs, options, delta0,
batch, bucket).

`ProductAgent` puts it into a team for evaluation (`make_generate_fn`,
`sat-jax eval --product_agent j --product_model DIR`): the slot's params
are the pair (pre_params, cur_params) and its turns are sampled here.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from sat_jax import sampling
from sat_jax.models import config as config_lib
from sat_jax.stage0 import projection
from sat_jax.team import lm_agent as lm_agent_lib

PyTree = Any


def _generate(
    pre_config,
    cur_config,
    options,
    delta0,
    pre_params,
    cur_params,
    tokens,
    mask,
    key,
):
  """Both models' prefill, then one decode loop over pi_new (jitted)."""
  tau = options.temperature if options.temperature > 0 else 1.0
  # pi_new is already at tau: the loop samples it at temperature 1 (or
  # greedily), with the options' top-k / top-p applied on top.
  loop_options = dataclasses.replace(
      options, temperature=0.0 if options.greedy else 1.0
  )
  logits_pre, cache_pre, step_pre = sampling.model_decoder(
      pre_config, options, pre_params, tokens, mask
  )
  logits_cur, cache_cur, step_cur = sampling.model_decoder(
      cur_config, options, cur_params, tokens, mask
  )

  def projected(logits_pre_BxV, logits_cur_BxV):
    return projection.project_logits(
        logits_pre_BxV, logits_cur_BxV, delta0, tau
    ).log_probs

  def step(prev_B, caches):
    logits_pre_BxV, c_pre = step_pre(prev_B, caches[0])
    logits_cur_BxV, c_cur = step_cur(prev_B, caches[1])
    return projected(logits_pre_BxV, logits_cur_BxV), (c_pre, c_cur)

  return sampling.decode(
      projected(logits_pre, logits_cur),
      (cache_pre, cache_cur),
      step,
      loop_options,
      key,
      jnp.sum(mask, axis=1) == 0,
  )


_generate_jit = jax.jit(_generate, static_argnums=(0, 1, 2, 3))


def check_pair(
    pre_config: config_lib.ModelConfig, cur_config: config_lib.ModelConfig
) -> None:
  """Raises unless the two models share a vocabulary."""
  if pre_config.vocab_size != cur_config.vocab_size:
    raise ValueError(
        "Stage 0 with one tokenizer needs equal vocabularies: pi_pre has"
        f" vocab_size {pre_config.vocab_size}, pi_cur"
        f" {cur_config.vocab_size}"
    )


def sample(
    pre_config: config_lib.ModelConfig,
    pre_params: PyTree,
    cur_config: config_lib.ModelConfig,
    cur_params: PyTree,
    prompt_tokens_BxP: jax.Array,
    prompt_mask_BxP: jax.Array,
    options: sampling.SamplingOptions,
    delta0: float,
    key: jax.Array,
) -> sampling.SampleOutput:
  """Samples from the projection of pi_pre onto the delta0-ball of pi_cur.

  As `sampling.sample` (same prompt handling and errors, the shorter of the
  two contexts), at `options.temperature` for both models (greedy: the
  argmax of pi_new at temperature 1).
  """
  check_pair(pre_config, cur_config)
  if not 0 <= delta0 < float("inf"):
    raise ValueError(f"delta0={delta0} must be finite and >= 0")
  shorter = (
      pre_config
      if pre_config.max_seq_len <= cur_config.max_seq_len
      else cur_config
  )
  tokens, mask = sampling.prepare_prompts(
      shorter, prompt_tokens_BxP, prompt_mask_BxP, options
  )
  return _generate_jit(
      pre_config,
      cur_config,
      options,
      float(delta0),
      pre_params,
      cur_params,
      tokens,
      mask,
      key,
  )


@dataclasses.dataclass(frozen=True)
class ProductAgent(lm_agent_lib.LMAgent):
  """A team slot that samples the product of experts (evaluation only).

  `config` is pi_cur's, the slot's own model (the team's context and
  tokenizer checks read it), `pre_config` pi_pre's; the slot's params are
  the pair (pre_params, cur_params). Its turns are drawn by `sample` at the
  options' temperature. Nothing trains it: the scoring methods raise
  TypeError, and a training rollout refuses it.
  """

  pre_config: config_lib.ModelConfig | None = None
  delta0: float = 0.0

  def __post_init__(self):
    super().__post_init__()
    if not isinstance(self.pre_config, config_lib.ModelConfig):
      raise TypeError(
          "ProductAgent.pre_config must be a ModelConfig, got"
          f" {type(self.pre_config)}"
      )
    check_pair(self.pre_config, self.config)
    if not 0 <= self.delta0 < float("inf"):
      raise ValueError(f"ProductAgent.delta0={self.delta0} must be >= 0")

  @property
  def param_configs(self) -> tuple[config_lib.ModelConfig, ...]:
    """The configs of the params pair, in order."""
    return (self.pre_config, self.config)

  def sample(self, params, tokens_BxP, mask_BxP, options, key):
    pre_params, cur_params = params
    return sample(
        self.pre_config,
        pre_params,
        self.config,
        cur_params,
        tokens_BxP,
        mask_BxP,
        options,
        self.delta0,
        key,
    )

  def _not_trainable(self, *args, **kwargs):
    # Refused by design (DESIGN §5 (a) is a decoding-time agent): its policy
    # has no parameters of its own to train.
    raise TypeError(
        "ProductAgent samples at decoding time only; distil it into a model"
        " (`sat-jax swap`) to train"
    )

  token_logprobs = kl_reference = logprobs_and_kl = state_kl = _not_trainable
