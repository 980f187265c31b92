"""The `sat-jax` command line: `sat-jax <command> [flags]`.

Each command lives in its own module, which defines its absl flags when it is
imported; only the chosen command's module is imported.
"""

import importlib
import sys

from absl import app

from sat_jax import host_memory

# command -> (module, function, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "sample": (
        "sat_jax.commands.sample",
        "main",
        "sample from a model (default: a tiny random model built offline)",
    ),
    "train": (
        "sat_jax.commands.train",
        "main",
        "the main job: SAT on an LM team from a config file",
    ),
    "pretrain": (
        "sat_jax.commands.pretrain",
        "main",
        "supervised warm start of a config's base model",
    ),
    "eval": (
        "sat_jax.commands.eval",
        "main",
        "evaluate a trained team checkpoint on a task or benchmark",
    ),
    "export": (
        "sat_jax.commands.export",
        "main",
        "write one agent of a team checkpoint as a Hugging Face folder",
    ),
    "swap": (
        "sat_jax.commands.swap",
        "main",
        "put a stronger model into one slot of a trained team (Stage 0)",
    ),
}


def _usage() -> str:
  lines = ["usage: sat-jax <command> [--flags]", "", "commands:"]
  width = max(len(name) for name in COMMANDS)
  for name, (_, _, help_text) in COMMANDS.items():
    lines.append(f"  {name:<{width}}  {help_text}")
  lines.append("")
  lines.append("`sat-jax <command> --help` lists a command's flags.")
  return "\n".join(lines)


def run(argv: list[str] | None = None) -> None:
  """Console entry point."""
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    sys.stdout.write(_usage() + "\n")
    sys.exit(0 if len(argv) >= 2 else 2)
  command = argv[1]
  if command not in COMMANDS:
    sys.stderr.write(f"sat-jax: unknown command {command!r}\n\n{_usage()}\n")
    sys.exit(2)
  # Before any JAX computation starts XLA's threads (see host_memory).
  host_memory.reuse_freed_pages()
  # Multi-host (TPU pod, multi-node GPU or CPU): connect the processes before
  # any device is touched, when SAT_JAX_DISTRIBUTED=1 (see multihost).
  from sat_jax import multihost  # pylint: disable=g-import-not-at-top

  multihost.initialize()
  module_name, function_name, _ = COMMANDS[command]
  module = importlib.import_module(module_name)
  app.run(
      getattr(module, function_name), argv=[f"sat-jax {command}"] + argv[2:]
  )


if __name__ == "__main__":
  run()
