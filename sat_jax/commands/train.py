"""`sat-jax train`: the main job, `train.train_and_evaluate` on a config file.

  sat-jax train --config experiments/demo.py
  sat-jax train --config experiments/demo.py --config.sat.delta=0.02 \\
      --workdir runs/demo_delta002

The workdir defaults to runs/<config name>. Rerunning the same command in
the same workdir resumes from its last complete stage. Without --config,
the run in --workdir goes on under its own config.json (a run written by
`sat-jax swap`, or any run to resume):

  sat-jax train --workdir runs/demo_swap1 --num_stages 20

(--num_stages and --time_budget_s change those fields of the saved config,
the two a resumed run may change.)
"""

import dataclasses
from typing import Sequence

from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from sat_jax import config as config_lib
from sat_jax import io_utils
from sat_jax import sharding
from sat_jax import train

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file with get_config(arg).",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (default: runs/<config name>)."
)
_NUM_STAGES = flags.DEFINE_integer(
    "num_stages", None, "With --workdir alone: the run's new stage count."
)
_TIME_BUDGET = flags.DEFINE_float(
    "time_budget_s", None, "With --workdir alone: the run's new time budget."
)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    if _WORKDIR.value is None:
      raise ValueError(
          "--config is required (e.g. --config experiments/demo.py), or"
          " --workdir alone to go on with a run's own config.json"
      )
    workdir = io_utils.local_path(_WORKDIR.value, "--workdir")
    config = train.load_run_config(workdir)
    changes = {
        "num_stages": _NUM_STAGES.value,
        "time_budget_s": _TIME_BUDGET.value,
    }
    config = dataclasses.replace(
        config, **{k: v for k, v in changes.items() if v is not None}
    )
  else:
    if _NUM_STAGES.value is not None or _TIME_BUDGET.value is not None:
      raise ValueError(
          "--num_stages / --time_budget_s go with --workdir alone; with"
          " --config use --config.num_stages / --config.time_budget_s"
      )
    config = config_lib.from_dict(_CONFIG.value)
    workdir = io_utils.local_path(
        _WORKDIR.value
        or config_lib.default_workdir(
            config, config_flags.get_config_filename(flags.FLAGS["config"])
        ),
        "--workdir",
    )
  mesh = sharding.make_mesh(config.mesh)
  logging.info(
      "sat-jax train: %d agents, method %s, %d stages, mesh %s, workdir %s",
      config.num_agents,
      config.sat.method,
      config.num_stages,
      dict(mesh.shape),
      workdir,
  )
  logging.info("devices: %s", jax.devices())
  summary = train.train_and_evaluate(config, workdir, mesh)
  logging.info(
      "held-out team accuracy %s -> %s (%s points); all accepted updates"
      " inside their trust region: %s; wall %.0f s",
      summary.get("initial_accuracy"),
      summary.get("final_accuracy"),
      summary.get("gain_points"),
      summary["all_accepted_inside_trust_region"],
      summary["time_wall_s"],
  )
