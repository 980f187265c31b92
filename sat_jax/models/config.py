"""ModelConfig for the decoder LM families, presets, and HF config.json I/O.

One frozen, hashable `ModelConfig` describes every supported family:

- `qwen3`: GQA, RoPE, per-head q/k RMSNorm, SwiGLU, no biases.
- `qwen2` (Qwen2 / Qwen2.5): as qwen3 but with q/k/v biases and no q/k norm.
- `llama` (Llama-3 / 3.1): no biases, no q/k norm, optional "llama3" RoPE
  scaling.

Presets (tiny test shapes and the real published ones) are in presets.py.

`qkv_bias` and `qk_norm` are facts of the family (the Hugging Face classes fix
them), so they default from `family` and must agree with it: a config that
says otherwise could not be saved as a transformers checkpoint.
"""

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

FAMILIES = ("qwen3", "qwen2", "llama")

# family -> (transformers architecture, qkv_bias, qk_norm)
_FAMILY_FACTS = {
    "qwen3": ("Qwen3ForCausalLM", False, True),
    "qwen2": ("Qwen2ForCausalLM", True, False),
    "llama": ("LlamaForCausalLM", False, False),
}


# What transformers' config classes assume for a field config.json leaves
# out (Qwen3Config / Qwen2Config / LlamaConfig class defaults), so that a
# sparse config.json means the same model here as there. A field given as
# null falls back as transformers does: kv heads = heads, head_dim =
# hidden_size // heads.
_HF_FIELD_DEFAULTS = {
    "qwen3": {
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
    },
    "qwen2": {"num_key_value_heads": 32, "max_position_embeddings": 32768},
    "llama": {"max_position_embeddings": 2048},
}


class ConfigError(ValueError):
  """A model config is invalid or unsupported; the message names the field."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Llama-3 ("llama3") RoPE frequency scaling.

  Wavelengths lambda = 2 pi / f longer than L / low_freq_factor are divided by
  `factor`; shorter than L / high_freq_factor are kept; in between they are
  interpolated with s = (L / lambda - low) / (high - low):
  f' = (1 - s) f / factor + s f, where L = original_max_position_embeddings.
  """

  factor: float
  low_freq_factor: float
  high_freq_factor: float
  original_max_position_embeddings: int
  kind: str = "llama3"

  def __post_init__(self):
    if self.kind != "llama3":
      raise ConfigError(f"rope_scaling.kind={self.kind!r}: only 'llama3'")
    if self.factor <= 0:
      raise ConfigError(f"rope_scaling.factor={self.factor} must be > 0")
    if not 0 < self.low_freq_factor < self.high_freq_factor:
      raise ConfigError(
          "rope_scaling needs 0 < low_freq_factor < high_freq_factor, got"
          f" {self.low_freq_factor}, {self.high_freq_factor}"
      )
    if self.original_max_position_embeddings <= 0:
      raise ConfigError(
          "rope_scaling.original_max_position_embeddings must be > 0"
      )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one decoder-only LM (hashable: a static jit argument)."""

  family: str
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 1e6
  rope_scaling: RopeScaling | None = None
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = False
  qkv_bias: bool | None = None  # None: from the family.
  qk_norm: bool | None = None  # None: from the family.
  max_seq_len: int = 4096

  def __post_init__(self):
    if self.family not in FAMILIES:
      raise ConfigError(
          f"family={self.family!r} is not supported; known: {FAMILIES}"
      )
    _, bias, norm = _FAMILY_FACTS[self.family]
    for name, fact in (("qkv_bias", bias), ("qk_norm", norm)):
      value = getattr(self, name)
      if value is None:
        object.__setattr__(self, name, fact)
      elif bool(value) != fact:
        raise ConfigError(
            f"{name}={value} contradicts family {self.family!r} ({fact})"
        )
    for name in (
        "vocab_size",
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "mlp_dim",
        "max_seq_len",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive int")
    if self.num_heads % self.num_kv_heads:
      raise ConfigError(
          f"num_heads={self.num_heads} is not divisible by"
          f" num_kv_heads={self.num_kv_heads}"
      )
    if self.head_dim % 2:
      raise ConfigError(f"head_dim={self.head_dim} must be even for RoPE")
    if not self.rope_theta > 0:
      raise ConfigError(f"rope_theta={self.rope_theta} must be > 0")
    if not self.rms_norm_eps > 0:
      raise ConfigError(f"rms_norm_eps={self.rms_norm_eps} must be > 0")
    if self.rope_scaling is not None and not isinstance(
        self.rope_scaling, RopeScaling
    ):
      raise ConfigError(
          f"rope_scaling={self.rope_scaling!r} must be a RopeScaling or None"
      )

  @property
  def group_size(self) -> int:
    """Query heads per kv head (G = H / K)."""
    return self.num_heads // self.num_kv_heads

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)


def num_params(config: ModelConfig) -> int:
  """Number of parameters (a tied embedding counted once)."""
  d, f, hd = config.hidden_size, config.mlp_dim, config.head_dim
  q, kv = config.num_heads * hd, config.num_kv_heads * hd
  layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * f
  if config.qkv_bias:
    layer += q + 2 * kv
  if config.qk_norm:
    layer += 2 * hd
  embed = config.vocab_size * d * (1 if config.tie_embeddings else 2)
  return embed + config.num_layers * layer + d


def _read_config_json(path_or_dict) -> tuple[dict[str, Any], str]:
  if isinstance(path_or_dict, Mapping):
    return dict(path_or_dict), "<dict>"
  path = pathlib.Path(os.fspath(path_or_dict))
  if path.is_dir():
    path = path / "config.json"
  if not path.is_file():
    raise ConfigError(f"{path}: no such file")
  try:
    return json.loads(path.read_text(encoding="utf-8")), str(path)
  except json.JSONDecodeError as e:
    raise ConfigError(f"{path}: not valid JSON ({e})") from e


def _rope_from_hf(hf: dict[str, Any], where: str):
  """(rope_theta, RopeScaling | None) from either HF rope spelling."""
  params = hf.get("rope_parameters")
  if params is None:  # transformers 4 spelling
    params = dict(hf.get("rope_scaling") or {})
    if "rope_theta" in hf:
      params.setdefault("rope_theta", hf["rope_theta"])
  params = dict(params)
  if "rope_theta" not in params:
    raise ConfigError(f"{where}: rope_theta missing")
  kind = params.get("rope_type", params.get("type", "default"))
  if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
    raise ConfigError(f"{where}: partial_rotary_factor is not supported")
  theta = float(params["rope_theta"])
  if kind == "default":
    return theta, None
  if kind != "llama3":
    raise ConfigError(
        f"{where}: rope_type={kind!r} is not supported (default, llama3)"
    )
  try:
    scaling = RopeScaling(
        float(params["factor"]),
        float(params["low_freq_factor"]),
        float(params["high_freq_factor"]),
        int(params["original_max_position_embeddings"]),
    )
  except KeyError as e:
    raise ConfigError(f"{where}: llama3 rope scaling lacks {e}") from e
  return theta, scaling


def config_from_hf(path_or_dict) -> ModelConfig:
  """Reads a Hugging Face config.json (a directory, the file, or a dict).

  Raises ConfigError naming the file and field for an unknown model_type, a
  missing field, or a feature we do not implement (sliding windows, other
  RoPE types, attention/MLP biases where the family has none, non-SiLU MLPs).
  """
  hf, where = _read_config_json(path_or_dict)
  family = hf.get("model_type")
  if family not in FAMILIES:
    raise ConfigError(
        f"{where}: model_type={family!r} is not supported; known: {FAMILIES}"
    )
  if hf.get("hidden_act", "silu") != "silu":
    raise ConfigError(f"{where}: hidden_act={hf['hidden_act']!r} (need silu)")
  if family != "qwen2" and hf.get("attention_bias", False):
    raise ConfigError(f"{where}: attention_bias=true is not supported")
  if hf.get("mlp_bias", False):
    raise ConfigError(f"{where}: mlp_bias=true is not supported")
  if hf.get("use_sliding_window", False):
    raise ConfigError(f"{where}: use_sliding_window=true is not supported")
  hf = {**_HF_FIELD_DEFAULTS[family], **hf}  # fields left out, as HF reads them

  def need(key):
    if key not in hf:
      raise ConfigError(f"{where}: field {key!r} missing")
    return hf[key]

  heads = int(need("num_attention_heads"))
  theta, scaling = _rope_from_hf(hf, where)
  try:
    return ModelConfig(
        family=family,
        vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or need("hidden_size") // heads),
        mlp_dim=int(need("intermediate_size")),
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=int(need("max_position_embeddings")),
    )
  except ConfigError as e:
    raise ConfigError(f"{where}: {e}") from e


def config_to_hf(config: ModelConfig, dtype: str = "float32") -> dict:
  """The config.json dict that transformers 5 loads as this architecture."""
  arch, _, _ = _FAMILY_FACTS[config.family]
  rope: dict[str, Any] = {
      "rope_type": "default",
      "rope_theta": config.rope_theta,
  }
  if config.rope_scaling is not None:
    s = config.rope_scaling
    rope.update(
        rope_type=s.kind,
        factor=s.factor,
        low_freq_factor=s.low_freq_factor,
        high_freq_factor=s.high_freq_factor,
        original_max_position_embeddings=s.original_max_position_embeddings,
    )
  hf = {
      "architectures": [arch],
      "model_type": config.family,
      "vocab_size": config.vocab_size,
      "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads,
      "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.head_dim,
      "intermediate_size": config.mlp_dim,
      "hidden_act": "silu",
      "rms_norm_eps": config.rms_norm_eps,
      "tie_word_embeddings": config.tie_embeddings,
      "max_position_embeddings": config.max_seq_len,
      "rope_parameters": rope,
      "dtype": dtype,
  }
  if config.family != "qwen2":
    hf["attention_bias"] = False
  if config.family != "llama":
    hf["use_sliding_window"] = False
  return hf
