"""Responders: who answers the team's questions in AR-Bench DC and SP.

In Detective Cases each suspect answers from its hidden facts (its story and
its role); in Situation Puzzles a referee who knows the hidden story answers
"Yes", "No" or "Unknown". AR-Bench plays both with an LLM, so scores depend
on which model that is. Here the responder is pluggable: anything with

    reply(facts: str, question: str, history: [(question, answer), ...]) -> str

where `facts` is the responder's whole instruction (role plus hidden facts,
written by the environment), `question` the team's question, and `history`
the earlier exchanges with the same responder.

- `ScriptedResponder(fn)`: replies `fn(facts, question)` and records every
  call; for tests and rule-based oracles.
- `LMResponder(config, params, tokenizer)`: a sat_jax model. The messages
  [system: facts, (user: q, assistant: a)..., user: question] are rendered
  with the tokenizer's chat template (the oldest (q, a) pairs dropped when
  too long; the facts never), sampled with `sat_jax.sampling.sample`,
  and the reply is the decoded text up to the stop token. Plug in your own
  model from a local Hugging Face checkpoint folder with
  `LMResponder.from_checkpoint("/path/to/Qwen2.5-7B-Instruct")`, or pass that
  path as `responder=` to the `arbench_dc` / `arbench_sp` tasks. AR-Bench's
  own runs sample the responder at temperature 0.7, top-p 0.7 (the defaults
  here); `temperature=0` makes the environment deterministic.
"""

import abc
import os
import pathlib
from typing import Any, Callable, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from sat_jax import models
from sat_jax import sampling

History = Sequence[tuple[str, str]]


class Responder(abc.ABC):
  """Answers one question from hidden facts."""

  @abc.abstractmethod
  def reply(self, facts: str, question: str, history: History = ()) -> str:
    """The reply to `question`, given the facts and earlier exchanges."""


class ScriptedResponder(Responder):
  """`fn(facts, question)`; every call is kept in `calls` for inspection."""

  def __init__(self, fn: Callable[[str, str], str]):
    self.fn = fn
    self.calls: list[tuple[str, str, tuple]] = []

  def reply(self, facts: str, question: str, history: History = ()) -> str:
    self.calls.append((facts, question, tuple(history)))
    return self.fn(facts, question)


class LMResponder(Responder):
  """A sat_jax language model answering through its chat template."""

  def __init__(
      self,
      config: models.ModelConfig,
      params: Any,
      tokenizer: Any,
      *,
      max_new_tokens: int = 64,
      temperature: float = 0.7,
      top_p: float = 0.7,
      seed: int = 0,
  ):
    models.check_fits(tokenizer, config)
    self.config, self.params, self.tokenizer = config, params, tokenizer
    self.options = sampling.SamplingOptions(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        stop_token_ids=models.stop_token_ids(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
    )
    fitting = [
        b
        for b in self.options.prompt_buckets
        if b + max_new_tokens <= config.max_seq_len
    ]
    if not fitting:
      raise ValueError(
          f"max_new_tokens={max_new_tokens} leaves no room for a prompt in "
          f"max_seq_len={config.max_seq_len}"
      )
    self.max_prompt_tokens = max(fitting)
    self._key = jax.random.key(seed)
    self._calls = 0

  @classmethod
  def from_checkpoint(
      cls,
      path: str | os.PathLike,
      tokenizer_path: str | os.PathLike | None = None,
      dtype: Any = jnp.bfloat16,
      **kwargs: Any,
  ) -> "LMResponder":
    """Loads a local HF checkpoint folder (tokenizer from the same folder)."""
    path = pathlib.Path(path).expanduser()
    config, params = models.load_hf(path, dtype)
    tokenizer = models.load_tokenizer(tokenizer_path or path)
    return cls(config, params, tokenizer, **kwargs)

  def prompt_ids(
      self, facts: str, question: str, history: History
  ) -> list[int]:
    """Chat-rendered ids, cut to `max_prompt_tokens` by whole exchanges.

    The system turn holds the facts the responder must answer from and the
    last user turn the question, so neither is ever cut: the oldest
    (question, answer) pairs of `history` are dropped until the prompt fits.
    Raises ValueError if the facts and the question alone do not fit.
    """

    def render(kept: History) -> list[int]:
      messages = [{"role": "system", "content": facts}]
      for q, a in kept:
        messages += [
            {"role": "user", "content": q},
            {"role": "assistant", "content": a},
        ]
      messages.append({"role": "user", "content": question})
      return models.render_chat(self.tokenizer, messages)

    history = list(history)
    for start in range(len(history) + 1):
      ids = render(history[start:])
      if len(ids) <= self.max_prompt_tokens:
        if start:
          logging.warning(
              "responder prompt cut to %d tokens by dropping its %d oldest"
              " of %d exchanges",
              len(ids),
              start,
              len(history),
          )
        return ids
    raise ValueError(
        f"the responder's facts ({len(facts)} chars) and question"
        f" ({len(question)} chars) alone render to {len(ids)} tokens, more"
        f" than max_prompt_tokens={self.max_prompt_tokens} (what max_seq_len"
        " leaves after max_new_tokens); shorten them or lower max_new_tokens"
    )

  def reply(self, facts: str, question: str, history: History = ()) -> str:
    ids = self.prompt_ids(facts, question, history)
    tokens_BxP, mask_BxP = sampling.pad_prompts([ids], self.options)
    key = jax.random.fold_in(self._key, self._calls)
    self._calls += 1
    out = sampling.sample(
        self.config, self.params, tokens_BxP, mask_BxP, self.options, key
    )
    tokens_N = np.asarray(jax.device_get(out.tokens_BxN))[0]
    length = int(jax.device_get(out.lengths_B)[0])
    new = [int(t) for t in tokens_N[:length]]
    new = [t for t in new if t not in self.options.stop_token_ids]
    return self.tokenizer.decode(new, skip_special_tokens=True).strip()


def make_responder(spec: Responder | str | os.PathLike | None) -> Responder:
  """A Responder as given, or an LMResponder from a checkpoint path."""
  if isinstance(spec, Responder):
    return spec
  if spec is None:
    raise ValueError(
        "this task needs a responder: pass responder=<a Responder> or "
        "responder=<a local Hugging Face checkpoint folder>"
    )
  if isinstance(spec, (str, os.PathLike)):
    return LMResponder.from_checkpoint(spec)
  raise TypeError(f"responder must be a Responder or a path, got {spec!r}")
