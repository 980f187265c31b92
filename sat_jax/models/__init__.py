"""Our Flax/JAX decoder LMs (Qwen3, Qwen2.5, Llama-3): the public entry points.

config, params = models.load_hf("/path/to/Qwen3-0.6B", dtype=jnp.bfloat16)
logits_BxTxV = models.forward(config, params, tokens_BxT, mask_BxT)
models.save_hf("/tmp/out", config, params)
"""

from sat_jax.models.config import config_from_hf
from sat_jax.models.config import config_to_hf
from sat_jax.models.config import ConfigError
from sat_jax.models.config import FAMILIES
from sat_jax.models.config import ModelConfig
from sat_jax.models.config import num_params
from sat_jax.models.config import RopeScaling
from sat_jax.models.hf_io import CheckpointError
from sat_jax.models.hf_io import load_hf
from sat_jax.models.hf_io import save_hf
from sat_jax.models.presets import get_preset
from sat_jax.models.presets import PRESETS
from sat_jax.models.tokenizer import check_fits
from sat_jax.models.tokenizer import load_tokenizer
from sat_jax.models.tokenizer import render_chat
from sat_jax.models.tokenizer import stop_token_ids
from sat_jax.models.tokenizer import TokenizerError
from sat_jax.models.transformer import cache_bytes
from sat_jax.models.transformer import default_positions
from sat_jax.models.transformer import forward
from sat_jax.models.transformer import hidden_states
from sat_jax.models.transformer import hidden_states_cached
from sat_jax.models.transformer import init_cache
from sat_jax.models.transformer import init_params
from sat_jax.models.transformer import KVCache
from sat_jax.models.transformer import logits_from_hidden
from sat_jax.models.transformer import param_axes
from sat_jax.models.transformer import param_shapes
from sat_jax.models.transformer import unembed_matrix
from sat_jax.models.transformer import unstack_layers
