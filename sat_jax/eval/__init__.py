"""Team evaluation: avg@K / pass@K / maj@K metrics and the evaluation loop."""
