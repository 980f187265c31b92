"""sat_jax: Sequential Agent Tuning (SAT) for teams of language models in JAX."""

__version__ = "0.1.0"
