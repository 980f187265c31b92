"""Model presets as data: tiny test shapes and real published architectures."""

from sat_jax.models.config import ConfigError
from sat_jax.models.config import ModelConfig
from sat_jax.models.config import RopeScaling


def _preset(
    family,
    vocab,
    d,
    layers,
    heads,
    kv,
    hd,
    f,
    tie,
    max_len,
    theta=1e6,
    eps=1e-6,
    scaling=None,
) -> ModelConfig:
  return ModelConfig(
      family=family,
      vocab_size=vocab,
      hidden_size=d,
      num_layers=layers,
      num_heads=heads,
      num_kv_heads=kv,
      head_dim=hd,
      mlp_dim=f,
      rope_theta=theta,
      rope_scaling=scaling,
      rms_norm_eps=eps,
      tie_embeddings=tie,
      max_seq_len=max_len,
  )


# Real shapes from the published config.json files on the Hugging Face hub
# (Qwen/Qwen3-0.6B, -1.7B, -4B, -8B, Qwen/Qwen2.5-3B, meta-llama/Llama-3.1-8B).
# fmt: off
PRESETS: dict[str, ModelConfig] = {
    # Tiny shapes for tests and demos (seconds on CPU).
    "qwen3-tiny": _preset("qwen3", 512, 64, 2, 4, 2, 16, 128, True, 512, 1e4),
    "qwen2-tiny": _preset("qwen2", 512, 64, 2, 4, 2, 16, 128, False, 512, 1e4),
    "llama-tiny": _preset("llama", 512, 64, 2, 4, 2, 16, 128, False, 512, 5e5,
                          1e-5, RopeScaling(8.0, 1.0, 4.0, 64)),
    # The two sampler benchmark shapes (benchmarks/).
    "qwen3-bench-small": _preset("qwen3", 4096, 256, 4, 8, 4, 32, 768, True,
                                 2048),
    "qwen3-bench-medium": _preset("qwen3", 32000, 512, 8, 8, 4, 64, 1536, True,
                                  2048),
    "qwen3-0.6b": _preset("qwen3", 151936, 1024, 28, 16, 8, 128, 3072, True,
                          40960),
    "qwen3-1.7b": _preset("qwen3", 151936, 2048, 28, 16, 8, 128, 6144, True,
                          40960),
    "qwen3-4b": _preset("qwen3", 151936, 2560, 36, 32, 8, 128, 9728, True,
                        40960),
    "qwen3-8b": _preset("qwen3", 151936, 4096, 36, 32, 8, 128, 12288, False,
                        40960),
    "qwen2.5-3b": _preset("qwen2", 151936, 2048, 36, 16, 2, 128, 11008, True,
                          32768),
    "llama-3.1-8b": _preset("llama", 128256, 4096, 32, 32, 8, 128, 14336,
                            False, 131072, 5e5, 1e-5,
                            RopeScaling(8.0, 1.0, 4.0, 8192)),
}
# fmt: on


def get_preset(name: str) -> ModelConfig:
  """The preset `name` (see PRESETS)."""
  if name not in PRESETS:
    raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
  return PRESETS[name]
