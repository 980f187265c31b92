"""`swap`: plug a stronger model into slot j of a trained team (Stage 0).

    report = swap.swap(source_workdir, agent=j, model_dir=..., out=...)

Reads the run in `source_workdir` (its config.json and a team checkpoint,
the latest by default), fits the new model to the projection of itself onto
slot j's trust region on states of the current team (`fit.py`), and writes
a new run directory `out` in which only slot j changed:

  out/config.json          the source config, team[j] now the new model
                           (with slot j's tokenizer, or its own)
  out/checkpoints/0/       the team: slot j the fitted model with a fresh
                           optimizer state, every other slot copied value
                           for value (params, optimizer state, beta, delta)
  out/metrics.jsonl        step 0: a "swap" row, and an "eval" row of the
                           swapped team when the config evaluates
  out/eval/step_0/         that evaluation's predictions
  out/swap.json            the report: fit history, held-out accuracy of
                           the team before and after the swap
  out/pretrain/            copied from the source (entries that say
                           "pretrain" still resolve)

`sat-jax train --workdir out` then continues SAT training from stage 0 of
the swapped team. Everything is built in a temporary sibling folder and
renamed into place at the end, so an interrupted swap leaves no `out`.

A new model with slot j's tokenizer (or none in its folder) is fitted to
the per-token projection (`fit.py`); one that brings another tokenizer is
fitted to the message-level projection (`messages.py`) and enters the team
with its own tokenizer and chat template (config.json's team[j].tokenizer
becomes its folder). `fit_overrides` may set `delta0` (default: slot j's
trust-region radius; for the message-level fit it bounds the KL of whole
messages) and any field of the fit's config; fields of the other fit's
config are ignored. One process (the swap is not written for multi-host
runs).
"""

import dataclasses
import math
import pathlib
import shutil
import tempfile
import time
from typing import Any, Sequence

from absl import logging
import jax

from sat_jax import checkpoint as checkpoint_lib
from sat_jax import config as config_lib
from sat_jax import io_utils
from sat_jax import metrics as metrics_lib
from sat_jax import models
from sat_jax import sharding
from sat_jax import team as team_lib
from sat_jax import train
from sat_jax.core import agent as agent_lib
from sat_jax.stage0 import fit as fit_lib
from sat_jax.stage0 import messages
from sat_jax.stage0 import product
from sat_jax.tasks import registry
from sat_jax.team import play
from sat_jax.team import transcript

REPORT_FILE = "swap.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


class SwapError(ValueError):
  """The swap cannot be done as asked; the message names what."""


def _tokenizer_rules(tokenizer: Any) -> str | None:
  backend = getattr(tokenizer, "backend_tokenizer", None)
  return None if backend is None else backend.to_str()


def own_tokenizer(model_dir: pathlib.Path, slot_tokenizer: Any) -> Any | None:
  """The new model's tokenizer when it differs from the slot's, else None.

  A folder without tokenizer files is taken to use the slot's. With the
  slot's vocabulary the new model enters under the slot's tokenizer and
  chat template (the token-level projection scores the slot's streams);
  if its own template or tokenization rules differ, they are not used,
  and a warning says so.
  """
  if not any((model_dir / f).is_file() for f in _TOKENIZER_FILES):
    return None
  own = models.load_tokenizer(model_dir)
  if own.get_vocab() != slot_tokenizer.get_vocab():
    return own
  differ = [
      what
      for what, get in (
          ("chat template", lambda t: getattr(t, "chat_template", None)),
          ("tokenization rules", _tokenizer_rules),
      )
      if get(own) != get(slot_tokenizer)
  ]
  if differ:
    logging.warning(
        "%s: same vocabulary as the slot, other %s; the new model will run"
        " under the slot's tokenizer and chat template",
        model_dir,
        " and ".join(differ),
    )
  return None


def load_model(model_dir, dtype, mesh):
  """(config, params) of a local HF folder, params sharded on `mesh`."""
  config = models.config_from_hf(model_dir)
  abstract = jax.eval_shape(
      lambda k: models.init_params(config, k, dtype), jax.random.key(0)
  )
  shardings = sharding.logical_to_sharding(
      models.param_axes(config), mesh, shapes=abstract
  )
  return config, models.load_hf(model_dir, dtype, shardings=shardings)[1]


def swap(
    source: str | pathlib.Path,
    agent: int,
    model_dir: str | pathlib.Path,
    out: str | pathlib.Path,
    *,
    step: int | None = None,
    fit_overrides: dict[str, Any] | None = None,
    evaluate: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
  """Writes the swapped run in `out` (module docstring); returns the report."""
  t_start = time.perf_counter()
  source = io_utils.local_path(source, "source workdir")
  out = io_utils.local_path(out, "out")
  model_dir = pathlib.Path(model_dir).resolve()
  if out.exists():
    raise SwapError(f"out={out} exists; the swap writes a new run directory")
  if not model_dir.is_dir():
    raise SwapError(f"model={model_dir}: no such folder")
  config = train.load_run_config(source)
  n = config.num_agents
  if not 0 <= agent < n:
    raise SwapError(f"agent={agent} is not a slot of the team of {n}")
  task = registry.get_task(config.task.name, **config.task.kwargs)
  mesh = sharding.make_mesh(config.mesh)
  key = jax.random.key(seed)
  with jax.set_mesh(mesh), sharding.logical_rules(config.mesh.logical_rules()):
    team, states, metas, step = train.restore_team(
        config, task, source, mesh, step
    )
    new_tokenizer = own_tokenizer(model_dir, team.tokenizers[agent])
    entry = config.team[agent]
    new_config, new_params = load_model(
        model_dir, jax.numpy.dtype(entry.dtype), mesh
    )
    cur_config = team.agents[agent].config
    if new_tokenizer is None and new_config.vocab_size != cur_config.vocab_size:
      raise SwapError(
          f"{model_dir}: vocab_size {new_config.vocab_size} != slot"
          f" {agent}'s {cur_config.vocab_size}"
      )
    if new_tokenizer is not None:
      models.check_fits(new_tokenizer, new_config)
    params = agent_lib.team_params(states)
    rollout_fn = train.stage_rollout_fn(config, team, task)
    delta0 = config.agent_deltas()[agent]
    overrides = dict(fit_overrides or {})
    unknown = (
        set(overrides)
        - _fields(fit_lib.FitConfig)
        - _fields(messages.MessageFitConfig)
    )
    if unknown:
      raise SwapError(
          f"fit_overrides: {sorted(unknown)} are fields of neither fit's"
          " config (FitConfig, MessageFitConfig)"
      )
    if "delta0" in overrides:
      delta0 = overrides.pop("delta0")
    fit_key = jax.random.fold_in(key, 0)
    if not math.isfinite(delta0):  # no trust region: the model enters as is
      fit_cfg, fitted, history = None, new_params, []
    elif new_tokenizer is None:
      fit_cfg = _token_config(config, agent, delta0, overrides)
      result = fit_lib.fit(
          fit_cfg,
          fit_lib.Model(new_config, new_params),
          fit_lib.Model(cur_config, params[agent]),
          _token_states(rollout_fn, params, agent),
          fit_key,
      )
    else:
      fit_cfg = _message_config(config, agent, delta0, overrides)
      renderers = [
          transcript.Renderer(
              tok,
              system_prompt=task.system_prompt,
              agent_tag=config.protocol.agent_tag,
              env_tag=config.protocol.env_tag,
              name=f"agent {agent} ({who})",
          )
          for tok, who in (
              (new_tokenizer, "new"),
              (team.tokenizers[agent], "current"),
          )
      ]
      result = messages.fit_messages(
          fit_cfg,
          messages.Side(new_config, new_params, renderers[0]),
          messages.Side(cur_config, params[agent], renderers[1]),
          agent,
          _message_states(rollout_fn, params, agent, config.protocol.protocol),
          fit_key,
      )
    if fit_cfg is not None:
      if not result.inside:
        last = result.history[-1]["kl_quantile"]
        raise SwapError(
            "the fitted model's KL quantile"
            f" {'(no estimate)' if last is None else format(last, '.4g')}"
            f" is still above {fit_cfg.bound:.4g} after {result.steps} steps;"
            " raise max_steps or learning_rate (nothing was written)"
        )
      fitted, history = result.params, result.history

    new_agent = team_lib.LMAgent(new_config, config.agent_temperature(agent))
    tokenizer_path = (
        metas[agent]["tokenizer"] if new_tokenizer is None else str(model_dir)
    )
    new_entry = dataclasses.replace(
        entry, model=str(model_dir), tokenizer=tokenizer_path
    )
    new_run = dataclasses.replace(
        config,
        team=config.team[:agent] + (new_entry,) + config.team[agent + 1 :],
    )
    slot_tokenizer = (
        team.tokenizers[agent] if new_tokenizer is None else new_tokenizer
    )
    new_team = train.Team(
        team.agents[:agent] + (new_agent,) + team.agents[agent + 1 :],
        team.tokenizers[:agent]
        + (slot_tokenizer,)
        + team.tokenizers[agent + 1 :],
        params[:agent] + (fitted,) + params[agent + 1 :],
        team.metas[:agent]
        + (
            {
                **team.metas[agent],
                "model": str(model_dir),
                "tokenizer": tokenizer_path,
                "model_config": config_lib.to_plain(new_config),
                "swapped_from_step": step,
            },
        )
        + team.metas[agent + 1 :],
    )
    fresh = train.initial_state(new_team, new_run)[agent]
    new_states = states[:agent] + (fresh,) + states[agent + 1 :]
    report = {
        "source": str(source),
        "source_step": step,
        "agent": agent,
        "model": str(model_dir),
        "delta0": delta0,
        # token: the per-state projection (one tokenizer); message: the
        # message-level one (the new model brings its own tokenizer).
        "projection": "token" if new_tokenizer is None else "message",
        "fit": None if fit_cfg is None else dataclasses.asdict(fit_cfg),
        "fit_steps": len(history) and history[-1]["step"],
        "history": history,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(
        tempfile.mkdtemp(prefix=f".{out.name}-swap-", dir=out.parent)
    )
    try:
      _write_run(
          tmp,
          source=source,
          source_config=config,
          source_team=team,
          source_params=params,
          new_run=new_run,
          new_team=new_team,
          new_states=new_states,
          report=report,
          evaluate=evaluate,
          key=key,
          task=task,
      )
      report = io_utils.read_json(tmp / REPORT_FILE)
      tmp.rename(out)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise
  logging.info(
      "swap: slot %d of %s (step %d) -> %s in %.0f s; report %s",
      agent,
      source,
      step,
      model_dir,
      time.perf_counter() - t_start,
      out / REPORT_FILE,
  )
  return report


def _token_config(config, agent, delta0, overrides) -> fit_lib.FitConfig:
  return fit_lib.FitConfig(**{
      "delta0": delta0,
      "quantile": config.sat.update.quantile,
      "temperature": config.agent_temperature(agent),
      **_known(fit_lib.FitConfig, overrides),
  })


def _message_config(
    config, agent, delta0, overrides
) -> messages.MessageFitConfig:
  return messages.MessageFitConfig(**{
      "delta0": delta0,
      "quantile": config.sat.update.quantile,
      "temperature": config.agent_temperature(agent),
      "max_new_tokens": config.protocol.max_new_tokens,
      **_known(messages.MessageFitConfig, overrides),
  })


def _fields(cls) -> set[str]:
  return {f.name for f in dataclasses.fields(cls)}


def _known(cls, overrides: dict[str, Any]) -> dict[str, Any]:
  """The overrides that `cls` has (the others belong to the other fit)."""
  return {k: v for k, v in overrides.items() if k in _fields(cls)}


def _token_states(rollout_fn, params, agent: int):
  """draw_states for `fit.fit`: slot `agent`'s view of a team rollout."""

  def draw(k: jax.Array) -> fit_lib.States:
    view = rollout_fn(params, k).views[agent]
    rollout_fn.pop_results()
    return fit_lib.States(
        view.inputs["tokens_ExT"],
        view.inputs["mask_ExT"],
        view.mask_ExT,
        view.inputs.get("positions_ExA"),
    )

  return draw


def _message_states(rollout_fn, params, agent: int, protocol: str):
  """draw_contexts for `messages.fit_messages`: what slot `agent` had seen
  at each of its turns in a team rollout."""

  def draw(k: jax.Array) -> list:
    rollout_fn(params, k)
    (result,) = rollout_fn.pop_results()
    return [
        seen
        for record in result.episodes
        for seen, _ in play.turn_contexts(record.messages, agent, protocol)
    ]

  return draw


def _write_run(
    tmp: pathlib.Path,
    *,
    source: pathlib.Path,
    source_config: config_lib.TrainConfig,
    source_team: train.Team,
    source_params: Sequence[Any],
    new_run: config_lib.TrainConfig,
    new_team: train.Team,
    new_states: Sequence[Any],
    report: dict[str, Any],
    evaluate: bool,
    key: jax.Array,
    task: Any,
) -> None:
  """Everything of the new run directory, in `tmp`."""
  if (source / "pretrain").is_dir():
    shutil.copytree(source / "pretrain", tmp / "pretrain")
  writer = metrics_lib.MetricsWriter(tmp)
  writer.write_config(config_lib.to_dict(new_run))
  rows: list = []
  config = source_config
  examples = list(task.load(config.eval.split))[: config.eval.num_problems]
  if evaluate and examples:
    key_eval = jax.random.fold_in(key, 1)
    before = train.evaluate_team(
        source_team,
        source_params,
        task,
        examples,
        config,
        key_eval,
        tmp / "eval" / "source",
    )
    after = train.evaluate_team(
        new_team,
        new_team.params,
        task,
        examples,
        config,
        key_eval,
        tmp / "eval" / "step_0",
    )
    shutil.rmtree(tmp / "eval" / "source")
    report["eval_before"] = train.eval_row(before)
    report["eval_after"] = train.eval_row(after)
    train.log_row(writer, rows, 0, train.eval_row(after), "eval")
  last = report["history"][-1] if report["history"] else {}
  swap_row = {
      "agent": report["agent"],
      "source_step": report["source_step"],
      "fit_steps": report["fit_steps"],
      **{f"fit_{k}": v for k, v in last.items() if k != "step"},
  }
  train.log_row(writer, rows, 0, swap_row, "swap")
  writer.close()
  cursor = {
      "stage": 0,
      "num_stages": new_run.num_stages,
      "swap": {"source": str(source), "agent": report["agent"]},
  }
  with checkpoint_lib.TeamCheckpointer(tmp / "checkpoints") as ckpt:
    ckpt.save(0, new_states, new_team.metas, cursor)
    ckpt.wait_until_finished()
  io_utils.atomic_write_json(tmp / REPORT_FILE, report)


def product_team(
    team: train.Team,
    params: Sequence[Any],
    agent: int,
    model_dir: str | pathlib.Path,
    delta0: float,
    dtype: Any,
    mesh: jax.sharding.Mesh,
) -> tuple[train.Team, tuple[Any, ...]]:
  """(team, params) with slot `agent` the product of experts of the model in
  `model_dir` (pi_pre) and the slot's own (pi_cur): decoding-time Stage 0,
  for evaluation (`product.ProductAgent`; `sat-jax eval --product_agent`).
  """
  if not 0 <= agent < len(team.agents):
    raise SwapError(
        f"agent={agent} is not a slot of the team of {len(team.agents)}"
    )
  model_dir = pathlib.Path(model_dir)
  if not model_dir.is_dir():
    raise SwapError(f"model={model_dir}: no such folder")
  if own_tokenizer(model_dir, team.tokenizers[agent]) is not None:
    raise SwapError(
        f"{model_dir}: its tokenizer differs from slot {agent}'s; the"
        " decoding-time product of experts needs one vocabulary (`sat-jax"
        " swap` fits a model with another tokenizer at the message level)"
    )
  pre_config, pre_params = load_model(model_dir, dtype, mesh)
  cur = team.agents[agent]
  if pre_config.vocab_size != cur.config.vocab_size:
    raise SwapError(
        f"{model_dir}: vocab_size {pre_config.vocab_size} != slot"
        f" {agent}'s {cur.config.vocab_size}"
    )
  slot = product.ProductAgent(
      cur.config,
      cur.temperature,
      cur.chunk_size,
      cur.remat,
      pre_config=pre_config,
      delta0=delta0,
  )
  agents = team.agents[:agent] + (slot,) + team.agents[agent + 1 :]
  params = tuple(params)
  pair = (pre_params, params[agent])
  new_params = params[:agent] + (pair,) + params[agent + 1 :]
  return dataclasses.replace(team, agents=agents, params=new_params), new_params
