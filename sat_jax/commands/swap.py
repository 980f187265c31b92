"""`sat-jax swap`: put a stronger model into one slot of a trained team.

  sat-jax swap --workdir runs/demo --agent 1 --model /models/stronger \\
      --out runs/demo_swap1
  sat-jax train --workdir runs/demo_swap1     # SAT goes on from there

The new model is fitted to its projection onto the slot's trust region
(DESIGN §5) on states of the current team, and written with the other
agents unchanged into a new run directory (`sat_jax.stage0.swap`): per
token when it shares the slot's tokenizer, per message when it brings its
own (it then keeps its tokenizer in the team). Fit settings: --delta0,
--max_steps, --learning_rate, --steps_per_batch, --target_fraction,
--slack, --penalty; per message --candidates, --states_per_batch,
--monitor_samples.
"""

from typing import Sequence

from absl import flags
from absl import logging

from sat_jax.stage0 import swap

_WORKDIR = flags.DEFINE_string("workdir", None, "The trained run directory.")
_AGENT = flags.DEFINE_integer("agent", None, "The slot to replace (0-based).")
_MODEL = flags.DEFINE_string(
    "model", None, "Local Hugging Face folder of the new model."
)
_OUT = flags.DEFINE_string(
    "out", None, "The new run directory (must not exist)."
)
_STEP = flags.DEFINE_integer(
    "step", None, "Team checkpoint to start from (default: the latest)."
)
_MAX_STEPS = flags.DEFINE_integer("max_steps", 300, "Most fitting steps.")
_LEARNING_RATE = flags.DEFINE_float(
    "learning_rate", 1e-4, "Peak AdamW rate (cosine decay to max_steps)."
)
_STEPS_PER_BATCH = flags.DEFINE_integer(
    "steps_per_batch", 8, "Fitting steps per rollout of states."
)
_TARGET_FRACTION = flags.DEFINE_float(
    "target_fraction", 0.5, "Projection radius as a fraction of delta."
)
_PENALTY = flags.DEFINE_float(
    "penalty",
    None,
    "Weight of the KL-excess penalty of the fit loss (default: 10 per"
    " token, 0 per message).",
)
_SLACK = flags.DEFINE_float(
    "slack", 0.0, "Accept KL quantile <= delta + slack."
)
_DELTA0 = flags.DEFINE_float(
    "delta0",
    None,
    "Radius of the projection (default: the slot's trust-region delta; per"
    " message it bounds the KL of whole messages).",
)
_CANDIDATES = flags.DEFINE_integer(
    "candidates", 8, "Per message: draws per state from each model."
)
_STATES_PER_BATCH = flags.DEFINE_integer(
    "states_per_batch", 32, "Per message: states per fitting batch."
)
_MONITOR_SAMPLES = flags.DEFINE_integer(
    "monitor_samples", 8, "Per message: draws per held-out state to check."
)
_EVAL = flags.DEFINE_bool(
    "eval", True, "Evaluate the team before and after the swap."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the fitting rollouts.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  for flag in (_WORKDIR, _AGENT, _MODEL, _OUT):
    if flag.value is None:
      raise ValueError(f"--{flag.name} is required")
  report = swap.swap(
      _WORKDIR.value,
      _AGENT.value,
      _MODEL.value,
      _OUT.value,
      step=_STEP.value,
      fit_overrides={
          "max_steps": _MAX_STEPS.value,
          "learning_rate": _LEARNING_RATE.value,
          "steps_per_batch": _STEPS_PER_BATCH.value,
          "target_fraction": _TARGET_FRACTION.value,
          "slack": _SLACK.value,
          "candidates": _CANDIDATES.value,
          "states_per_batch": _STATES_PER_BATCH.value,
          "monitor_samples": _MONITOR_SAMPLES.value,
          **{
              name: flag.value
              for name, flag in (("delta0", _DELTA0), ("penalty", _PENALTY))
              if flag.value is not None
          },
      },
      evaluate=_EVAL.value,
      seed=_SEED.value,
  )
  last = report["history"][-1] if report["history"] else {}
  logging.info(
      "swapped slot %d (%s-level projection) after %s fitting steps; KL"
      " quantile %s (delta %s); held-out accuracy before %s, after %s",
      report["agent"],
      report["projection"],
      report["fit_steps"],
      last.get("kl_quantile"),
      report["delta0"],
      report.get("eval_before"),
      report.get("eval_after"),
  )
