"""Command-line commands of `sat-jax`, one module each."""
