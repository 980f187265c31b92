"""`sat-jax eval`: a trained team checkpoint on a task or benchmark.

  sat-jax eval --workdir runs/demo                        # latest stage
  sat-jax eval --workdir runs/demo --step 0 --k 8         # the starting team
  sat-jax eval --workdir runs/demo --task math500 \\
      --task_kwargs path=/data/math500.jsonl --protocol vote

K samples per problem (default: the paper's K for the task,
`runner.default_k`; for tasks without one, the run's eval.k), scored by the
task's verifier; avg@K, unbiased pass@k, maj@K of the team answer (relay:
the last message; vote: the voted answer; solo: the pool's vote) and each
agent's own avg@K. Writes predictions.jsonl, summary.json and summary.md to
--out (default <workdir>/evals/<task>_step<step>, with _<split> after the
task for a split other than test, and _<protocol>, _product<j>, _seed<s>
after the step when given). The team is rebuilt from
the run's config.json and restored from checkpoints/<step>.

  sat-jax eval --workdir runs/demo --product_agent 1 \
      --product_model /models/stronger --product_delta 0.1

evaluates the team with slot 1 sampled from the product of experts of the
stronger model and its own (Stage 0 at decoding time, DESIGN §5 (a);
`sat_jax.stage0.product`).
"""

import dataclasses
import json
from typing import Any, Sequence

from absl import flags
from absl import logging
import jax

from sat_jax import checkpoint as checkpoint_lib
from sat_jax import config as config_lib
from sat_jax import io_utils
from sat_jax import sharding
from sat_jax import train
from sat_jax.core import agent as agent_lib
from sat_jax.eval import runner
from sat_jax.stage0 import swap
from sat_jax.tasks import registry

_WORKDIR = flags.DEFINE_string(
    "workdir", None, "A `sat-jax train` run directory.", required=True
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: latest).")
_TASK = flags.DEFINE_string("task", None, "Task name (default: the run's).")
_TASK_KWARGS = flags.DEFINE_multi_string(
    "task_kwargs", [], "key=value task arguments (values parsed as JSON)."
)
_SPLIT = flags.DEFINE_string("split", "test", "Split to evaluate.")
_NUM_PROBLEMS = flags.DEFINE_integer(
    "num_problems", 0, "First N problems of the split (0: all)."
)
_K = flags.DEFINE_integer("k", None, "Samples per problem (default: paper K).")
_PROTOCOL = flags.DEFINE_string("protocol", None, "Override the protocol.")
_ROUTER = flags.DEFINE_string("router", None, "Override the router.")
_ROUNDS = flags.DEFINE_integer("rounds", None, "Override the rounds.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", None, "Sampling temperature (default: the run's eval)."
)
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", None, "Problems per generate call (default: the run's)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the samples.")
_OUT = flags.DEFINE_string("out", None, "Output folder.")


_PRODUCT_AGENT = flags.DEFINE_integer(
    "product_agent",
    None,
    "Stage 0 at decoding time: sample this slot from the product of experts"
    " of --product_model and the slot's own model.",
)
_PRODUCT_MODEL = flags.DEFINE_string(
    "product_model", None, "Local HF folder of the stronger model (pi_pre)."
)
_PRODUCT_DELTA = flags.DEFINE_float(
    "product_delta",
    None,
    "The projection's radius (default: the slot's delta).",
)


def parse_kwargs(items: Sequence[str]) -> dict[str, Any]:
  """["a=1", "path=x.jsonl"] -> {"a": 1, "path": "x.jsonl"} (JSON if it is)."""
  out = {}
  for item in items:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise ValueError(f"--task_kwargs {item!r} is not key=value")
    try:
      out[key] = json.loads(value)
    except json.JSONDecodeError:
      out[key] = value
  return out


def check_counts(
    k: int | None, num_problems: int, batch_size: int | None
) -> None:
  """Rejects --k, --num_problems and --batch_size values that mean nothing.

  Checked before anything runs, so that a bad value is an error rather than
  quietly replaced by a default or, for --num_problems, taken as a count
  from the end of the split.
  """
  if k is not None and k < 1:
    raise ValueError(f"--k={k}: must be >= 1 (leave it out for the paper K)")
  if num_problems < 0:
    raise ValueError(f"--num_problems={num_problems}: must be >= 0 (0: all)")
  if batch_size is not None and batch_size < 1:
    raise ValueError(
        f"--batch_size={batch_size}: must be >= 1 (leave it out for the run's)"
    )


def default_out_name(
    task: str,
    split: str,
    step: int,
    protocol: str | None,
    product_agent: int | None,
    seed: int,
) -> str:
  """<task>_step<step>, plus what sets this evaluation apart from another
  of the same step (so that one does not overwrite the other): a split
  other than test, a protocol override, a product slot, a seed other
  than 0."""
  name = task if split == "test" else f"{task}_{split}"
  name += f"_step{step}"
  if protocol is not None:
    name += f"_{protocol}"
  if product_agent is not None:
    name += f"_product{product_agent}"
  return name if seed == 0 else f"{name}_seed{seed}"


def check_product_flags(
    agent: int | None, model: str | None, delta: float | None
) -> None:
  """--product_model and --product_agent go together; --product_delta
  needs them (before the team is built, not after)."""
  if (agent is None) != (model is None):
    given, missing = (
        ("--product_agent", "--product_model")
        if model is None
        else ("--product_model", "--product_agent")
    )
    raise ValueError(f"{given} needs {missing} (the product of experts)")
  if delta is not None and agent is None:
    raise ValueError(
        "--product_delta needs --product_agent and --product_model"
    )


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  check_counts(_K.value, _NUM_PROBLEMS.value, _BATCH_SIZE.value)
  check_product_flags(
      _PRODUCT_AGENT.value, _PRODUCT_MODEL.value, _PRODUCT_DELTA.value
  )
  workdir = io_utils.local_path(_WORKDIR.value, "--workdir")
  config = train.load_run_config(workdir)
  run_task = registry.get_task(config.task.name, **config.task.kwargs)
  if _TASK.value is None or _TASK.value == config.task.name:
    kwargs = dict(config.task.kwargs, **parse_kwargs(_TASK_KWARGS.value))
    task_name = config.task.name
  else:
    kwargs, task_name = parse_kwargs(_TASK_KWARGS.value), _TASK.value
  task = registry.get_task(task_name, **kwargs)
  if _K.value is not None:
    k = _K.value  # checked above
  else:
    try:
      k = runner.default_k(task_name)
    except ValueError:  # no paper K (e.g. the synthetic tasks): the run's k
      k = config.eval.k
  overrides = {
      name: value
      for name, value in (
          ("protocol", _PROTOCOL.value),
          ("router", _ROUTER.value),
          ("rounds", _ROUNDS.value),
      )
      if value is not None
  }
  protocol = dataclasses.replace(config.protocol, **overrides)
  protocol.check_team(config.num_agents)
  eval_cfg = dataclasses.replace(
      config.eval,
      temperature=(
          config.eval.temperature
          if _TEMPERATURE.value is None
          else _TEMPERATURE.value
      ),
      batch_size=(
          config.eval.batch_size
          if _BATCH_SIZE.value is None
          else _BATCH_SIZE.value
      ),
  )
  config = dataclasses.replace(config, eval=eval_cfg)
  examples = list(task.load(_SPLIT.value))
  if _NUM_PROBLEMS.value:
    examples = examples[: _NUM_PROBLEMS.value]
  # Read-only: the run may still be training (and saving) in this workdir.
  ckpt = checkpoint_lib.TeamCheckpointer(
      workdir / "checkpoints", async_save=False, read_only=True
  )
  step = ckpt.latest_step() if _STEP.value is None else _STEP.value
  if step is None:
    raise checkpoint_lib.CheckpointError(f"{ckpt.directory}: no checkpoints")
  out = io_utils.local_path(
      _OUT.value
      or workdir
      / "evals"
      / default_out_name(
          task_name,
          _SPLIT.value,
          step,
          _PROTOCOL.value,
          _PRODUCT_AGENT.value,
          _SEED.value,
      ),
      "--out",
  )
  mesh = sharding.make_mesh(config.mesh)
  with jax.set_mesh(mesh), sharding.logical_rules(config.mesh.logical_rules()):
    team = train.build_team(
        config, run_task, workdir, mesh, allow_pretrain=False
    )
    state, _, cursor = ckpt.restore(step, train.initial_state(team, config))
    ckpt.close()
    params = agent_lib.team_params(state)
    product = None
    if _PRODUCT_AGENT.value is not None:
      j = _PRODUCT_AGENT.value
      if not 0 <= j < config.num_agents:
        raise ValueError(
            f"--product_agent={j} is not a slot of the team of"
            f" {config.num_agents}"
        )
      delta0 = _PRODUCT_DELTA.value
      delta0 = config.agent_deltas()[j] if delta0 is None else delta0
      team, params = swap.product_team(
          team,
          params,
          j,
          _PRODUCT_MODEL.value,
          delta0,
          jax.numpy.dtype(config.team[j].dtype),
          mesh,
      )
      product = {"agent": j, "model": _PRODUCT_MODEL.value, "delta0": delta0}
    summary = train.evaluate_team(
        team,
        params,
        task,
        examples,
        config,
        jax.random.key(_SEED.value),
        out,
        k=k,
        protocol=protocol,
        progress=True,
        meta={
            "workdir": str(workdir),
            "step": step,
            "cursor": cursor,
            "protocol": protocol.protocol,
            "router": protocol.router,
            "rounds": protocol.rounds,
            "split": _SPLIT.value,
            "product": product,
        },
    )
  logging.info("wrote %s: %s", out, summary)
