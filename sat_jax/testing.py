"""Offline test fixtures shared by everyone's tests and the demo.

- `tiny_config(family)`: tiny ModelConfigs (the "*-tiny" presets).
- `build_tiny_tokenizer(path)`: a byte-level BPE trained offline on generated
  text, with ChatML special tokens and a chat template, saved for
  `AutoTokenizer`.
- `build_char_tokenizer()`: one token per printable ASCII character, no
  merges; `permuted_tokenizer(tok, path)` moves every id of a tokenizer by
  a permutation, and `permute_vocab(params, perm)` moves a tied model's
  embedding rows to match (the same policy over other ids).
- `save_tiny_hf_model(path, family)`: a random transformers PyTorch model
  saved with `save_pretrained` (needs the `test` extra: torch).

Nothing here touches the network.
"""

import os
import pathlib
from typing import Any

from sat_jax.models import presets
from sat_jax.models.config import ModelConfig

TINY_VOCAB = 512
IM_START, IM_END, ENDOFTEXT, PAD = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|pad|>",
)
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)

# ChatML, as the Qwen instruct models use.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

_WORDS = (
    "the a an one two three four five six seven eight nine ten plus minus"
    " times is are what how many agent team answer question solve add sum"
    " number total apples books cats dogs has have gives left then so we"
    " first second next finally think step because therefore result equals"
).split()


def tiny_config(family: str = "qwen3", **overrides: Any) -> ModelConfig:
  """The `{family}-tiny` preset with `overrides` applied."""
  return presets.get_preset(f"{family}-tiny").replace(**overrides)


def _corpus(num_lines: int = 400) -> list[str]:
  """Deterministic pseudo-sentences with words and numbers."""
  lines, state = [], 12345
  for _ in range(num_lines):
    words = []
    for _ in range(6 + state % 7):
      state = (state * 1103515245 + 12345) % 2**31
      if state % 5 == 0:
        words.append(str(state % 1000))
      else:
        words.append(_WORDS[state % len(_WORDS)])
    lines.append(" ".join(words) + ("?" if state % 3 == 0 else "."))
  return lines


def build_tiny_tokenizer(
    path: str | os.PathLike, vocab_size: int = 500
) -> pathlib.Path:
  """Trains and saves a tiny byte-level BPE tokenizer with a chat template.

  eos is <|im_end|> (the end of a chat turn), pad is <|pad|>. All ids are <
  `vocab_size` <= TINY_VOCAB, so it fits the tiny configs.
  """
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  bpe = tokenizers.Tokenizer(tokenizers.models.BPE())
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False
  )
  bpe.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False,
  )
  bpe.train_from_iterator(_corpus(), trainer=trainer)
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe,
      eos_token=IM_END,
      pad_token=PAD,
      unk_token=None,
  )
  tok.chat_template = CHAT_TEMPLATE
  path = pathlib.Path(path)
  tok.save_pretrained(str(path))
  return path


def build_char_tokenizer() -> Any:
  """One token per printable ASCII character, no merges, ChatML template.

  Any id sequence of plain characters is the canonical tokenisation of its
  text, so even a random model writes messages that survive a round trip
  through text (Stage 0's message-level tests need that).
  """
  import string  # pylint: disable=g-import-not-at-top
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  chars = sorted(set(string.printable) - set("\r\x0b\x0c\t"))
  vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + tuple(chars))}
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
  bpe.add_special_tokens(list(SPECIAL_TOKENS))
  bpe.decoder = tokenizers.decoders.Fuse()
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe, eos_token=IM_END, pad_token=PAD, unk_token=None
  )
  tok.chat_template = CHAT_TEMPLATE
  return tok


def permuted_tokenizer(
    tok: Any, path: str | os.PathLike, seed: int = 0
) -> tuple[Any, Any]:
  """(tokenizer, perm): `tok` with id i moved to perm[i], saved in `path`.

  Same texts, same segmentation, other ids (a "different tokenizer" whose
  every result can be checked against the original's).
  """
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  spec = json.loads(tok.backend_tokenizer.to_str())
  vocab = spec["model"]["vocab"]
  perm = np.random.default_rng(seed).permutation(len(vocab))
  spec["model"]["vocab"] = {t: int(perm[i]) for t, i in vocab.items()}
  for added in spec["added_tokens"]:
    added["id"] = int(perm[added["id"]])
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  (path / "tokenizer.json").write_text(json.dumps(spec))
  out = transformers.PreTrainedTokenizerFast(
      tokenizer_file=str(path / "tokenizer.json"),
      eos_token=IM_END,
      pad_token=PAD,
      unk_token=None,
  )
  out.chat_template = CHAT_TEMPLATE
  out.save_pretrained(str(path))
  return out, perm


def permute_vocab(params: Any, perm: Any) -> Any:
  """A tied model's params with embedding row i moved to perm[i]."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  if "lm_head" in params:
    raise ValueError("permute_vocab moves tied embeddings only (lm_head)")
  embed = jnp.asarray(params["embed"])
  moved = embed.at[jnp.asarray(perm)].set(embed[: len(perm)])
  return dict(params, embed=moved)


def hf_tiny_config(family: str = "qwen3", tie: bool = False, **overrides):
  """A transformers config equal in shape to `tiny_config(family)`.

  Written with transformers' own classes and field names (not through
  `config_to_hf`), so that tests also check our config.json reader.
  """
  import transformers  # pylint: disable=g-import-not-at-top

  kwargs = dict(
      vocab_size=TINY_VOCAB,
      hidden_size=64,
      intermediate_size=128,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      head_dim=16,
      max_position_embeddings=512,
      rms_norm_eps=1e-6,
      tie_word_embeddings=tie,
  )
  if family == "llama":
    kwargs["rms_norm_eps"] = 1e-5
    kwargs["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 5e5,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
  kwargs.update(overrides)
  classes = {
      "qwen3": transformers.Qwen3Config,
      "qwen2": transformers.Qwen2Config,
      "llama": transformers.LlamaConfig,
  }
  return classes[family](**kwargs)


def random_hf_model(hf_config, seed: int = 0, std: float = 0.05):
  """A transformers causal LM with every weight random (norms and biases too).

  transformers initialises norms to 1 and biases to 0; randomising them
  makes a parity test see every tensor.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(hf_config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(std * torch.randn_like(p))
  return model.eval()


def save_tiny_hf_model(
    path: str | os.PathLike,
    family: str = "qwen3",
    *,
    tie: bool = False,
    seed: int = 0,
    max_shard_size: str | None = None,
    **overrides: Any,
) -> pathlib.Path:
  """Saves a tiny random transformers model of `family` to `path`."""
  model = random_hf_model(hf_tiny_config(family, tie, **overrides), seed)
  path = pathlib.Path(path)
  kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
  model.save_pretrained(str(path), **kwargs)
  return path
