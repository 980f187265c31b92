"""Tokenizers from local folders, the tokenizer/model fit check, chat rendering.

Tokenizers are transformers `AutoTokenizer`s read with `local_files_only`, so
nothing is downloaded. Chat messages are rendered to token ids with the
tokenizer's own chat template (or one passed in).
"""

import os
import pathlib
from typing import Any, Mapping, Sequence

import transformers

from sat_jax.models import config as config_lib

Message = Mapping[str, str]  # {"role": ..., "content": ...}


class TokenizerError(ValueError):
  """A tokenizer is missing, lacks a template or special ids, or misfits."""


def load_tokenizer(path: str | os.PathLike) -> Any:
  """AutoTokenizer from a local folder (no network)."""
  path = pathlib.Path(path)
  if not path.is_dir():
    raise TokenizerError(f"{path}: tokenizer folder not found")
  try:
    return transformers.AutoTokenizer.from_pretrained(
        str(path), local_files_only=True
    )
  except (OSError, ValueError) as e:
    raise TokenizerError(f"{path}: cannot load a tokenizer ({e})") from e


def check_fits(tokenizer: Any, config: config_lib.ModelConfig) -> None:
  """Raises TokenizerError unless the tokenizer can drive this model.

  Every id the tokenizer can produce (`len(tokenizer)`, added tokens
  included) must be < vocab_size (the model's embedding may be larger, as
  Qwen's padded vocabularies are), and pad and eos ids must be defined.
  """
  n = len(tokenizer)
  if n > config.vocab_size:
    raise TokenizerError(
        f"tokenizer has {n} tokens but the model's vocab_size is"
        f" {config.vocab_size}"
    )
  for name in ("eos_token_id", "pad_token_id"):
    value = getattr(tokenizer, name, None)
    if value is None:
      raise TokenizerError(f"tokenizer has no {name}")
    if not 0 <= value < config.vocab_size:
      raise TokenizerError(f"tokenizer {name}={value} is outside the vocab")


def render_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
) -> list[int]:
  """Token ids of `messages` rendered with the chat template.

  `chat_template` overrides the tokenizer's. In transformers 5
  `apply_chat_template(tokenize=True)` returns a BatchEncoding; the ids are
  taken from it.
  """
  template = chat_template or getattr(tokenizer, "chat_template", None)
  if not template:
    raise TokenizerError(
        "tokenizer has no chat template; pass chat_template= to render_chat"
    )
  for i, m in enumerate(messages):
    if "role" not in m or "content" not in m:
      raise TokenizerError(f"messages[{i}] needs 'role' and 'content': {m}")
  encoded = tokenizer.apply_chat_template(
      [dict(m) for m in messages],
      chat_template=template,
      add_generation_prompt=add_generation_prompt,
      tokenize=True,
  )
  ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded
  return [int(i) for i in ids]


def stop_token_ids(
    tokenizer: Any, extra: Sequence[str] = ()
) -> tuple[int, ...]:
  """eos id plus the ids of the `extra` special tokens (e.g. "<|im_end|>")."""
  ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
  for token in extra:
    i = tokenizer.convert_tokens_to_ids(token)
    if i is None or i == tokenizer.unk_token_id:
      raise TokenizerError(f"stop token {token!r} is not in the vocabulary")
    ids.append(int(i))
  return tuple(dict.fromkeys(int(i) for i in ids))
