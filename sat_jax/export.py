"""One agent of a team checkpoint as a Hugging Face folder.

`export(workdir, agent, out, step=None)` writes config.json + safetensors
(`models.save_hf`, loadable by transformers and by `sat_jax.models.load_hf`)
and the agent's tokenizer, built under a temporary name and renamed into
place. An exported agent can enter another team (a config entry's `model`)
or `sat-jax swap`. The command is `sat-jax export`.
"""

import pathlib
import shutil
import tempfile

from absl import logging
import jax

from sat_jax import io_utils
from sat_jax import models
from sat_jax import sharding
from sat_jax import train
from sat_jax.tasks import registry


def export(
    workdir: str | pathlib.Path,
    agent: int,
    out: str | pathlib.Path,
    step: int | None = None,
) -> pathlib.Path:
  """Writes agent `agent` of `step` to `out`; returns `out`."""
  workdir = io_utils.local_path(workdir, "--workdir")
  out = io_utils.local_path(out, "--out")
  if out.exists():
    raise FileExistsError(f"--out={out} exists")
  config = train.load_run_config(workdir)
  if not 0 <= agent < config.num_agents:
    raise ValueError(
        f"--agent={agent} is not a slot of the team of {config.num_agents}"
    )
  task = registry.get_task(config.task.name, **config.task.kwargs)
  mesh = sharding.make_mesh(config.mesh)
  with jax.set_mesh(mesh), sharding.logical_rules(config.mesh.logical_rules()):
    team, states, _, step = train.restore_team(
        config, task, workdir, mesh, step
    )
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
  try:
    models.save_hf(
        tmp / "model",
        team.agents[agent].config,
        jax.device_get(states[agent].params),
    )
    team.tokenizers[agent].save_pretrained(str(tmp / "model"))
    (tmp / "model").rename(out)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  logging.info(
      "exported agent %d of %s (step %d) to %s", agent, workdir, step, out
  )
  return out
