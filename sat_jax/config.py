"""Run configs: ConfigDict files in, frozen validated dataclasses out.

Experiments are Python files with `get_config(arg=None) -> ConfigDict`
(`experiments/demo.py`), overridable on the command line
(`--config.sat.delta=0.02`, `--config.team[1].delta=0.1`). `from_dict`
converts one, once, at the boundary into a `TrainConfig`; nothing below
`train.py` sees a ConfigDict. Every field is checked here: an unknown key, a
bad name (protocol, router, method, ...), a model or tokenizer folder that
does not exist, or a group size < 2 raises ValueError naming the field
before any work starts. `to_dict` gives the JSON-able effective config that
a run saves as config.json, and `from_dict(to_dict(c)) == c`.

Team entries: `model` is a local Hugging Face folder or "pretrain" (the
warm start builds one, `sat_jax.sft`); `tokenizer` defaults to the model's
folder. Per-agent `delta`, `beta_init` and `temperature` override the run's.
A per-agent learning rate is not offered: the SAT core compiles one update
per agent architecture from one `UpdateConfig` (see the report).
"""

import dataclasses
import os
import pathlib
import types
import typing
from typing import Any, Mapping

import ml_collections

from sat_jax import sharding
from sat_jax import team
from sat_jax.core import config as core_config

PRETRAIN = "pretrain"
ProtocolConfig = team.ProtocolConfig
# Dataclass fields whose names are ConfigDict methods get another key there
# (`--config.sat.agent_update.epochs=4`); from_dict accepts both spellings.
CONFIG_DICT_KEYS = {"update": "agent_update"}


def _fail(field: str, value: Any, rule: str) -> None:
  raise ValueError(f"{field}={value!r}: must be {rule}")


def _check_int(field: str, value: Any, low: int) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < low:
    _fail(field, value, f"an int >= {low}")


def _check_pos(field: str, value: Any, allow_zero: bool = False) -> None:
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if not ok or not (value >= 0 if allow_zero else value > 0):
    _fail(field, value, ">= 0" if allow_zero else "> 0")


def _build(cls, values: Mapping[str, Any] | None, where: str, **nested):
  """cls(**values) after checking every key is a field of cls.

  `nested` maps a field name to a converter applied to its value.
  """
  values = dict(values or {})
  names = [f.name for f in dataclasses.fields(cls)]
  unknown = sorted(set(values) - set(names))
  if unknown:
    raise ValueError(f"{where}: unknown field(s) {unknown}; known: {names}")
  for name, convert in nested.items():
    if name in values:
      values[name] = convert(values[name])
  try:
    return cls(**values)
  except TypeError as e:
    raise ValueError(f"{where}: {e}") from e


@dataclasses.dataclass(frozen=True)
class AgentEntry:
  """One team slot: where its model and tokenizer come from, overrides."""

  name: str = ""
  model: str = PRETRAIN  # a local HF folder, or "pretrain"
  tokenizer: str | None = None  # default: the model's folder
  dtype: str = "float32"
  delta: float | None = None  # default: sat.delta
  beta_init: float | None = None  # default: sat.beta_init
  temperature: float | None = None  # default: rollout.temperature

  def __post_init__(self):
    if self.model != PRETRAIN and not pathlib.Path(self.model).is_dir():
      raise ValueError(
          f"team entry {self.name!r}: model={self.model!r} is neither"
          f" {PRETRAIN!r} nor an existing folder"
      )
    if self.tokenizer is not None and not pathlib.Path(self.tokenizer).is_dir():
      raise ValueError(
          f"team entry {self.name!r}: tokenizer={self.tokenizer!r} is not an"
          " existing folder"
      )
    if self.dtype not in ("float32", "bfloat16"):
      _fail(f"team[{self.name}].dtype", self.dtype, "float32 or bfloat16")
    for field in ("delta", "beta_init", "temperature"):
      value = getattr(self, field)
      if value is not None:
        _check_pos(f"team[{self.name}].{field}", value, field == "beta_init")


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """The task by registry name and its keyword arguments."""

  name: str = "arithmetic"
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      _fail("task.name", self.name, "a registered task name")
    object.__setattr__(self, "kwargs", dict(self.kwargs))


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """Per stage: prompts_per_stage prompts x group_size episodes each."""

  prompts_per_stage: int = 16
  group_size: int = 8
  temperature: float = 1.0  # every agent's, unless its entry overrides it
  split: str = "train"
  # The sampler's own mesh (rollouts and held-out evaluation); None: the
  # training mesh. E.g. on a 2-core CPU host with JAX_NUM_CPU_DEVICES=2:
  # mesh = {"num_devices": 1} and rollout.mesh = {"num_devices": 2}.
  mesh: sharding.MeshConfig | None = None

  def __post_init__(self):
    _check_int("rollout.prompts_per_stage", self.prompts_per_stage, 1)
    if not isinstance(self.group_size, int) or self.group_size < 2:
      _fail(
          "rollout.group_size",
          self.group_size,
          "an int >= 2 (the advantage is relative to the group)",
      )
    _check_pos("rollout.temperature", self.temperature)

  @property
  def num_episodes(self) -> int:
    return self.prompts_per_stage * self.group_size


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Held-out team accuracy: the first num_problems of `split`, K each."""

  num_problems: int = 64
  k: int = 2
  batch_size: int = 32  # problems per generate call
  every_stages: int = 1  # and always after the last stage
  temperature: float | None = None  # default: the agents' (0: greedy)
  split: str = "test"

  def __post_init__(self):
    _check_int("eval.num_problems", self.num_problems, 0)
    _check_int("eval.k", self.k, 1)
    _check_int("eval.batch_size", self.batch_size, 1)
    _check_int("eval.every_stages", self.every_stages, 1)
    if self.temperature is not None:
      _check_pos("eval.temperature", self.temperature, allow_zero=True)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  max_to_keep: int | None = 3
  async_save: bool = True

  def __post_init__(self):
    if self.max_to_keep is not None:
      _check_int("checkpoint.max_to_keep", self.max_to_keep, 1)


@dataclasses.dataclass(frozen=True)
class ModelShape:
  """Architecture of a pretrained-from-scratch agent (vocab: tokenizer's)."""

  family: str = "qwen3"
  hidden_size: int = 128
  num_layers: int = 2
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  mlp_dim: int = 512
  max_seq_len: int = 512
  tie_embeddings: bool = True
  rope_theta: float = 1e4


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
  """Supervised warm start on task demonstrations (`sat_jax.sft`).

  Each training sequence is one relay turn: the speaker at position p
  (uniform in [0, positions)) sees p earlier messages, each a correct
  demonstration or, with probability wrong_prob, one with corrupt_digits
  digits changed; the target is always a correct demonstration. With
  `split_demonstration`, the demonstration's lines are shared out among the
  `positions` speakers (`sft.split_lines`): speaker p writes its share after
  the earlier speakers' shares, the last one the answer line, so that every
  speaker's step decides the team's answer (when the run builds its base,
  positions must then equal the team size, and the protocol be a one-round
  relay).

  With `target_success` > 0 the warm start stops early: every `check_every`
  steps from `check_from` on, the team of base copies answers
  `check_problems` train problems held out of the fine-tuning data (one
  sample each, at eval_temperature), and training stops after the first
  check whose team success reaches `target_success`; `steps` is then the
  most it runs (and the learning-rate schedule's length). Where a fixed step
  count lands varies with the host and the data (a base that solves 5% or
  60%); a target lands near it.
  """

  model: ModelShape = ModelShape()
  tokenizer: str | None = None  # None: build a BPE on the task's text
  tokenizer_vocab_size: int = 400
  steps: int = 600
  batch_size: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 50
  weight_decay: float = 0.01
  positions: int = 3
  wrong_prob: float = 0.5
  corrupt_digits: int = 1
  split_demonstration: bool = False
  eval_problems: int = 128
  eval_temperature: float = 1.0
  target_success: float = 0.0  # > 0: stop at the first check reaching it
  check_every: int = 20
  check_from: int = 0  # no check before this step (early ones cost time)
  check_problems: int = 128
  seed: int = 0

  def __post_init__(self):
    if self.tokenizer is not None and not pathlib.Path(self.tokenizer).is_dir():
      _fail("pretrain.tokenizer", self.tokenizer, "an existing folder or None")
    for field in (
        "tokenizer_vocab_size",
        "steps",
        "batch_size",
        "positions",
        "check_every",
        "check_problems",
    ):
      _check_int(f"pretrain.{field}", getattr(self, field), 1)
    _check_pos("pretrain.target_success", self.target_success, allow_zero=True)
    if self.target_success > 1:
      _fail("pretrain.target_success", self.target_success, "in [0, 1]")
    for field in (
        "warmup_steps",
        "corrupt_digits",
        "eval_problems",
        "check_from",
    ):
      _check_int(f"pretrain.{field}", getattr(self, field), 0)
    _check_pos("pretrain.learning_rate", self.learning_rate)
    _check_pos("pretrain.weight_decay", self.weight_decay, allow_zero=True)
    _check_pos("pretrain.eval_temperature", self.eval_temperature)
    if not 0 <= self.wrong_prob <= 1:
      _fail("pretrain.wrong_prob", self.wrong_prob, "in [0, 1]")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything `sat-jax train` runs (module docstring)."""

  team: tuple[AgentEntry, ...]
  sat: core_config.SATConfig = core_config.SATConfig()
  protocol: ProtocolConfig = ProtocolConfig()
  task: TaskConfig = TaskConfig()
  rollout: RolloutConfig = RolloutConfig()
  eval: EvalConfig = EvalConfig()
  mesh: sharding.MeshConfig = sharding.MeshConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  pretrain: PretrainConfig = PretrainConfig()
  num_stages: int = 10
  # > 0: stop after the stage that passes it; the run's wall time, summed
  # over the processes that ran it (up to each one's last checkpoint).
  time_budget_s: float = 0.0
  seed: int = 0
  name: str = ""

  def __post_init__(self):
    object.__setattr__(self, "team", tuple(self.team))
    if not self.team:
      _fail("team", self.team, "a non-empty list of agent entries")
    names = [e.name for e in self.team]
    if len(set(names)) != len(names):
      _fail("team names", names, "distinct")
    _check_int("num_stages", self.num_stages, 0)
    _check_pos("time_budget_s", self.time_budget_s, allow_zero=True)
    _check_int("seed", self.seed, 0)
    n = len(self.team)
    if self.sat.method == "single" and self.sat.single_agent >= n:
      _fail("sat.single_agent", self.sat.single_agent, f"< {n} (team size)")
    if isinstance(self.sat.order, tuple):
      core_config.check_permutation(self.sat.order, n)
    # Per-agent tuples need n entries, and the per-agent deltas and betas
    # together must pass SATConfig's checks.
    self.sat_config()
    if self.rollout.num_episodes % self.sat.update.minibatches:
      _fail(
          "sat.update.minibatches",
          self.sat.update.minibatches,
          f"a divisor of the {self.rollout.num_episodes} episodes per stage",
      )
    self.protocol.check_team(n)
    builds_base = any(e.model == PRETRAIN for e in self.team)
    if self.pretrain.split_demonstration and builds_base:
      if self.pretrain.positions != n:
        _fail(
            "pretrain.positions",
            self.pretrain.positions,
            f"the team size {n} with pretrain.split_demonstration",
        )
      if (self.protocol.protocol, self.protocol.rounds) != ("relay", 1):
        _fail(
            "protocol",
            (self.protocol.protocol, self.protocol.rounds),
            "('relay', 1) with pretrain.split_demonstration",
        )

  @property
  def num_agents(self) -> int:
    return len(self.team)

  def agent_deltas(self) -> tuple[float, ...]:
    base = self.sat.agent_deltas(self.num_agents)
    return tuple(
        d if e.delta is None else float(e.delta)
        for d, e in zip(base, self.team)
    )

  def agent_temperature(self, j: int) -> float:
    t = self.team[j].temperature
    return self.rollout.temperature if t is None else float(t)

  def agent_beta_inits(self) -> tuple[float, ...]:
    base = self.sat.agent_beta_inits(self.num_agents)
    return tuple(
        b if e.beta_init is None else float(e.beta_init)
        for b, e in zip(base, self.team)
    )

  def sat_config(self) -> core_config.SATConfig:
    """The core's SATConfig with the per-agent deltas and betas folded in.

    Built (and so validated: a zero beta_init with a finite delta and
    backtracking without step scaling is refused) when the config is.
    """

    def fold(values):
      return values[0] if len(set(values)) == 1 else values

    return dataclasses.replace(
        self.sat,
        delta=fold(self.agent_deltas()),
        beta_init=fold(self.agent_beta_inits()),
    )


def _tuple(x):
  return tuple(_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x


def _sat(values: Mapping[str, Any]) -> core_config.SATConfig:
  values = dict(values)
  if CONFIG_DICT_KEYS["update"] in values:
    if "update" in values:
      raise ValueError("sat: both 'update' and 'agent_update' given")
    values["update"] = values.pop(CONFIG_DICT_KEYS["update"])

  def update(u):
    return _build(
        core_config.UpdateConfig,
        u,
        "sat.update",
        optimizer=lambda o: _build(
            core_config.OptimizerConfig, o, "sat.update.optimizer"
        ),
    )

  def certificate(c):
    if c is None:
      return None
    return _build(
        core_config.CertificateConfig,
        c,
        "sat.certificate",
        reward_bounds=_tuple,
    )

  return _build(
      core_config.SATConfig,
      values,
      "sat",
      update=update,
      certificate=certificate,
      order=lambda o: o if isinstance(o, str) else _tuple(o),
      delta=lambda d: _tuple(d) if isinstance(d, (list, tuple)) else d,
      beta_init=lambda b: _tuple(b) if isinstance(b, (list, tuple)) else b,
  )


def to_plain(x: Any) -> Any:
  """Dataclasses, ConfigDicts, FieldReferences, tuples -> dicts and lists."""
  if dataclasses.is_dataclass(x) and not isinstance(x, type):
    x = dataclasses.asdict(x)
  if hasattr(x, "to_dict"):
    x = x.to_dict()
  if hasattr(x, "get") and not isinstance(x, Mapping):
    x = x.get()  # an ml_collections FieldReference
  if isinstance(x, Mapping):
    return {k: to_plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_plain(v) for v in x]
  return x


def from_dict(config: Any) -> TrainConfig:
  """A TrainConfig from a ConfigDict or a (JSON) dict; see the module doc."""
  values = to_plain(config)
  if not isinstance(values, dict):
    raise ValueError(f"config must be a dict, got {type(values).__name__}")
  team = values.pop("team", None)
  if not isinstance(team, list) or not team:
    _fail("team", team, "a non-empty list of agent entries")
  entries = []
  for j, entry in enumerate(team):
    entry = dict(entry)
    entry.setdefault("name", f"agent{j}")
    entries.append(_build(AgentEntry, entry, f"team[{j}]"))
  values["team"] = tuple(entries)

  def mesh(m, where="mesh"):
    return _build(sharding.MeshConfig, m, where, axes=_tuple, rules=_tuple)

  def pretrain(p):
    return _build(
        PretrainConfig,
        p,
        "pretrain",
        model=lambda m: _build(ModelShape, m, "pretrain.model"),
    )

  return _build(
      TrainConfig,
      values,
      "config",
      sat=_sat,
      protocol=lambda p: _build(
          ProtocolConfig,
          p,
          "protocol",
          prompt_buckets=_tuple,
          view_buckets=_tuple,
      ),
      task=lambda t: _build(TaskConfig, t, "task"),
      rollout=lambda r: _build(
          RolloutConfig,
          r,
          "rollout",
          mesh=lambda m: None if m is None else mesh(m, "rollout.mesh"),
      ),
      eval=lambda e: _build(EvalConfig, e, "eval"),
      mesh=mesh,
      checkpoint=lambda c: _build(CheckpointConfig, c, "checkpoint"),
      pretrain=pretrain,
  )


def to_dict(config: TrainConfig) -> dict[str, Any]:
  """The JSON-able effective config (tuples become lists)."""
  return to_plain(config)


def _placeholder_type(hint: Any) -> type:
  """The non-None type of an optional field's annotation (for the CLI).

  An optional dataclass (e.g. `rollout.mesh`) is a ConfigDict placeholder: a
  config file sets it to a ConfigDict of that dataclass's fields.
  """
  if (
      isinstance(hint, types.UnionType)
      or typing.get_origin(hint) is typing.Union
  ):
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    hint = options[0] if options else str
  if dataclasses.is_dataclass(hint):
    return ml_collections.ConfigDict
  return hint if isinstance(hint, type) else str


def to_config_dict(obj: Any) -> ml_collections.ConfigDict:
  """A config dataclass as a ConfigDict with every field overridable.

  None fields become typed placeholders (so `--config.x=...` can set them),
  nested dataclasses nested ConfigDicts, tuples of dataclasses lists of
  them, mappings ConfigDicts. `from_dict` reads the result back.
  """
  hints = typing.get_type_hints(type(obj))
  out = {}
  for field in dataclasses.fields(obj):
    value = getattr(obj, field.name)
    key = CONFIG_DICT_KEYS.get(field.name, field.name)
    if dataclasses.is_dataclass(value):
      out[key] = to_config_dict(value)
    elif value is None:
      out[key] = ml_collections.config_dict.placeholder(
          _placeholder_type(hints[field.name])
      )
    elif (
        isinstance(value, tuple)
        and value
        and dataclasses.is_dataclass(value[0])
    ):
      out[key] = [to_config_dict(v) for v in value]
    elif isinstance(value, Mapping):
      out[key] = ml_collections.ConfigDict(dict(value))
    else:
      out[key] = value
  return ml_collections.ConfigDict(out)


def default_workdir(
    config: TrainConfig, config_file: str | None = None
) -> pathlib.Path:
  """runs/<config name>, else runs/<config file stem>, else runs/train."""
  name = config.name
  if not name and config_file:
    name = pathlib.Path(config_file.partition(":")[0]).stem
  return pathlib.Path("runs") / (name or "train")
