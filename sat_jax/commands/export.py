"""`sat-jax export`: one agent of a team checkpoint as a Hugging Face folder.

  sat-jax export --workdir runs/demo --agent 2 --out exported/agent2
  sat-jax export --workdir runs/demo --agent 2 --step 10 --out ...

See `sat_jax.export`.
"""

from typing import Sequence

from absl import flags

from sat_jax import export as export_lib

_WORKDIR = flags.DEFINE_string("workdir", None, "The run directory.")
_AGENT = flags.DEFINE_integer("agent", None, "The slot to export (0-based).")
_OUT = flags.DEFINE_string("out", None, "The folder to write (must not exist).")
_STEP = flags.DEFINE_integer(
    "step", None, "Team checkpoint (default: the latest)."
)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  for flag in (_WORKDIR, _AGENT, _OUT):
    if flag.value is None:
      raise ValueError(f"--{flag.name} is required")
  export_lib.export(_WORKDIR.value, _AGENT.value, _OUT.value, _STEP.value)
