"""Logical axis names -> mesh axes: the one table of rules, and constraints.

Model code names the dimensions of parameters and activations with logical
names ("batch", "embed", ...). This module owns the mapping from those names to
the physical mesh axes ("data", "fsdp", "tensor"), so that nothing in the model
mentions a mesh axis.
"""

import contextlib
import contextvars
from typing import Sequence

import jax
from jax.sharding import PartitionSpec

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Default rules: FSDP plus data parallel for the batch, tensor parallel on the
# wide dimensions (a no-op while the "tensor" axis has size 1).
DEFAULT_RULES: LogicalRules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("act_heads", "tensor"),
    ("act_kv_heads", None),
    ("act_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", None),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
)

_RULES: contextvars.ContextVar[LogicalRules] = contextvars.ContextVar(
    "sat_jax_logical_rules", default=DEFAULT_RULES
)


@contextlib.contextmanager
def logical_rules(rules: LogicalRules):
  """Use `rules` for `logical_to_spec` and `shard` inside the block."""
  token = _RULES.set(tuple(rules))
  try:
    yield
  finally:
    _RULES.reset(token)


def current_rules() -> LogicalRules:
  return _RULES.get()


def logical_to_spec(
    names: Sequence[str | None], rules: LogicalRules | None = None
) -> PartitionSpec:
  """Maps a tuple of logical dimension names to a PartitionSpec.

  A mesh axis is used at most once per spec: a later dimension whose rule names
  an axis already taken stays unsharded (as flax's logical partitioning does).
  """
  table = dict(current_rules() if rules is None else rules)
  used: set[str] = set()
  spec = []
  for name in names:
    if name is None:
      spec.append(None)
      continue
    if name not in table:
      raise KeyError(
          f"logical axis {name!r} has no rule; rules: {sorted(table)}"
      )
    target = table[name]
    axes = (target,) if isinstance(target, str) else (target or ())
    axes = tuple(a for a in axes if a not in used)
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def shard(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Constrains activation `x` to the sharding its logical `names` imply.

  A no-op when no mesh is set (`jax.set_mesh`), so model code runs unchanged on
  one device. Mesh axes not present in the current mesh are dropped.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  if len(names) != x.ndim:
    raise ValueError(f"{len(names)} logical names {names} for shape {x.shape}")
  present = set(mesh.axis_names)
  spec = []
  for entry in logical_to_spec(names):
    axes = (entry,) if isinstance(entry, str) else (entry or ())
    axes = tuple(a for a in axes if a in present)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return jax.lax.with_sharding_constraint(x, PartitionSpec(*spec))
