"""Verifiable tasks: synthetic generators and real benchmark loaders."""
