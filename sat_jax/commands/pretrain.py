"""`sat-jax pretrain`: the supervised warm start of a config (`sat_jax.sft`).

  sat-jax pretrain --config experiments/demo.py

writes runs/<config name>/pretrain/base (HF safetensors, tokenizer,
pretrain.json with the held-out success), which `sat-jax train` with the
same config then reuses; `--out DIR` writes elsewhere (point a team entry's
`model` at it to use it).
"""

import json
from typing import Sequence

from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from sat_jax import config as config_lib
from sat_jax import io_utils
from sat_jax import multihost
from sat_jax import sft
from sat_jax.tasks import registry

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "Experiment config file with get_config(arg).",
    lock_config=True,
)
_OUT = flags.DEFINE_string(
    "out", None, "Output folder (default: <run workdir>/pretrain/base)."
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory whose base to build (default: runs/<name>)."
)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise ValueError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise ValueError("--config is required, e.g. --config experiments/demo.py")
  config = config_lib.from_dict(_CONFIG.value)
  workdir = io_utils.local_path(
      _WORKDIR.value
      or config_lib.default_workdir(
          config, config_flags.get_config_filename(flags.FLAGS["config"])
      ),
      "--workdir",
  )
  out = io_utils.local_path(
      _OUT.value or workdir / "pretrain" / "base", "--out"
  )
  task = registry.get_task(config.task.name, **config.task.kwargs)
  if not multihost.is_primary():
    # One process trains and writes the base (on one device); the others
    # have nothing to add and must not write the same folder.
    logging.info(
        "process %d: the warm start runs in process 0", jax.process_index()
    )
    return
  info = sft.pretrain(
      config.pretrain,
      task,
      out,
      protocol=config.protocol,
      num_agents=config.num_agents,
      progress=True,
  )
  logging.info("wrote %s: %s", out, json.dumps(info.get("eval")))
