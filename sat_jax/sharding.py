"""Mesh, logical axis rules and sharded creation: how arrays meet devices.

Model code names the dimensions of parameters and activations with logical
names ("batch", "embed", ...). This module owns the mapping from those names to
the physical mesh axes ("data", "fsdp", "tensor"), so that nothing in the model
mentions a mesh axis. It also builds the mesh from a `MeshConfig`, creates
parameters and optimizer state already sharded, and checks that no large
parameter was left replicated.

Indivisible dimensions: a dimension whose size is not divisible by the product
of the mesh axes its rule names keeps the longest prefix of those axes whose
product divides it, down to no axis (replicated along that dimension). E.g. a
vocab of 4099 over tensor=2 is replicated along the vocab dimension, and a
batch of 4 under ("data", "fsdp") = (2, 4) is split over "data" only. The
alternative (padding) would change the shapes the model sees.
"""

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

from absl import logging
import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

PyTree = Any
LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Physical mesh axes, in the order the mesh is built (outermost first): data
# parallelism across the slowest links, tensor parallelism across the fastest.
MESH_AXES = ("data", "fsdp", "tensor")

# Default rules: FSDP plus data parallel for the batch, tensor parallel on the
# wide dimensions (a no-op while the "tensor" axis has size 1). kv heads go
# over "tensor" as the query heads do, so query head h and its kv head h // G
# land on the same device (attention stays local) and k/v projections and the
# KV cache are split rather than copied; a kv-head count that "tensor" does
# not divide falls back to replicated (below).
DEFAULT_RULES: LogicalRules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
)

_RULES: contextvars.ContextVar[LogicalRules] = contextvars.ContextVar(
    "sat_jax_logical_rules", default=DEFAULT_RULES
)


def _rule_axes(target: Any) -> tuple[str, ...]:
  return (target,) if isinstance(target, str) else tuple(target or ())


def merge_rules(
    overrides: Sequence[Sequence[Any]], base: LogicalRules = DEFAULT_RULES
) -> LogicalRules:
  """`base` with the rules of `overrides` replacing (or adding) by name.

  Every target must be None, a mesh axis name or a tuple of them; a bad entry
  raises ValueError naming it.
  """
  table = dict(base)
  for entry in overrides:
    if len(entry) != 2 or not isinstance(entry[0], str):
      raise ValueError(f"rule {entry!r} is not a (logical_name, axes) pair")
    name, target = entry
    target = tuple(target) if isinstance(target, list) else target
    if not isinstance(target, (str, tuple, type(None))) or any(
        a not in MESH_AXES for a in _rule_axes(target)
    ):
      raise ValueError(
          f"rule for {name!r}: {target!r} is not None, a mesh axis of "
          f"{MESH_AXES} or a tuple of them"
      )
    table[name] = target
  return tuple(table.items())


@dataclasses.dataclass(frozen=True)
class MeshConfig:
  """Mesh shape by axis name plus overrides of the logical rules.

  Attributes:
    axes: (name, size) pairs over "data", "fsdp" and "tensor"; one size may be
      -1 to take the remaining devices. An axis left out has size 1. The mesh
      always has the three axes in MESH_AXES order, whatever the order here.
    rules: (logical_name, mesh_axes) pairs replacing DEFAULT_RULES entries.
    num_devices: how many devices the mesh spans, the first ones of the
      list `make_mesh` is given (default: all of `jax.devices()`); -1: all.
      E.g. a sampler mesh over two CPU devices beside a training mesh on one
      (`RolloutConfig.mesh`).
  """

  axes: tuple[tuple[str, int], ...] = (("data", -1), ("fsdp", 1), ("tensor", 1))
  rules: LogicalRules = ()
  num_devices: int = -1

  def __post_init__(self):
    for entry in self.axes:
      if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        raise ValueError(f"MeshConfig.axes entry {entry!r} is not (name, size)")
    axes = tuple(tuple(a) for a in self.axes)
    names = [a[0] for a in axes]
    for name, size in axes:
      if name not in MESH_AXES:
        raise ValueError(f"MeshConfig.axes: unknown axis {name!r}; {MESH_AXES}")
      if names.count(name) > 1:
        raise ValueError(f"MeshConfig.axes: axis {name!r} given twice")
      is_int = isinstance(size, int) and not isinstance(size, bool)
      if not is_int or (size < 1 and size != -1):
        raise ValueError(
            f"MeshConfig.axes: size {size!r} of {name!r} is not -1 or >= 1"
        )
    if [a[1] for a in axes].count(-1) > 1:
      raise ValueError(f"MeshConfig.axes {axes}: more than one size is -1")
    n = self.num_devices
    if not isinstance(n, int) or isinstance(n, bool) or (n < 1 and n != -1):
      raise ValueError(f"MeshConfig.num_devices={n!r} is not -1 or >= 1")
    object.__setattr__(self, "axes", axes)
    object.__setattr__(self, "rules", merge_rules(self.rules, base=()))

  def shape(self, num_devices: int) -> dict[str, int]:
    """Axis sizes for `num_devices`, with -1 resolved, in MESH_AXES order."""
    given = dict(self.axes)
    fixed = math.prod(s for s in given.values() if s != -1)
    if -1 in given.values():
      if num_devices % fixed:
        raise ValueError(
            f"MeshConfig.axes {self.axes}: fixed sizes (product {fixed}) do "
            f"not divide {num_devices} devices"
        )
      given = {
          k: num_devices // fixed if s == -1 else s for k, s in given.items()
      }
    elif fixed != num_devices:
      raise ValueError(
          f"MeshConfig.axes {self.axes}: product {fixed} != {num_devices} "
          "devices (use -1 for one axis to fill the rest)"
      )
    return {name: given.get(name, 1) for name in MESH_AXES}

  def logical_rules(self) -> LogicalRules:
    """DEFAULT_RULES with this config's overrides applied."""
    return merge_rules(self.rules)


def make_mesh(
    mesh_config: MeshConfig, devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A ("data", "fsdp", "tensor") mesh with Auto axis types.

  Over the first `mesh_config.num_devices` of `devices` (default: all of
  `jax.devices()`). Auto, not `jax.make_mesh`'s default Explicit: under
  Explicit axes a matmul contracting a sharded dimension raises
  ShardingTypeError.
  """
  devices = jax.devices() if devices is None else list(devices)
  n = mesh_config.num_devices
  if n > len(devices):
    raise ValueError(
        f"MeshConfig.num_devices={n} exceeds the {len(devices)} devices"
        " available (on CPU hosts, JAX_NUM_CPU_DEVICES sets how many)"
    )
  if (
      n not in (-1, len(devices))
      and len({d.process_index for d in devices}) > 1
  ):
    # Every process runs each jitted call over the whole mesh; a mesh of the
    # first n devices would leave some processes out (or hold only part of
    # one host's devices), so over several processes a mesh spans them all.
    raise ValueError(
        f"MeshConfig.num_devices={n}: a mesh over some of the devices is"
        f" only supported in a single process; these {len(devices)} devices"
        " belong to several processes, so use num_devices=-1"
    )
  devices = devices if n == -1 else devices[:n]
  shape = mesh_config.shape(len(devices))
  return jax.make_mesh(
      tuple(shape.values()),
      MESH_AXES,
      axis_types=(AxisType.Auto,) * len(MESH_AXES),
      devices=devices,
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
    axes = tuple(a for a in _rule_axes(table[name]) if a not in used)
    used.update(axes)
    spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return PartitionSpec(*spec)


def _fit_spec(
    names: Sequence[str | None],
    shape: Sequence[int] | None,
    axis_sizes: Mapping[str, int],
    rules: LogicalRules | None,
) -> PartitionSpec:
  """logical_to_spec restricted to the mesh's axes and to dividing sizes."""
  if shape is not None and len(names) != len(shape):
    raise ValueError(f"{len(names)} logical names {names} for shape {shape}")
  spec = []
  for d, entry in enumerate(logical_to_spec(names, rules)):
    wanted = [a for a in _rule_axes(entry) if a in axis_sizes]
    axes = list(wanted)
    while shape is not None and axes:
      if shape[d] % math.prod(axis_sizes[a] for a in axes) == 0:
        break
      axes.pop()
    if axes != wanted:
      logging.info(
          "dim %d (%r) of shape %s is not divisible by %s: sharded over %s",
          d,
          names[d],
          tuple(shape),
          wanted,
          axes or "nothing",
      )
    spec.append(
        None if not axes else axes[0] if len(axes) == 1 else tuple(axes)
    )
  return PartitionSpec(*spec)


def _is_names(x: Any) -> bool:
  return isinstance(x, (tuple, list)) and all(
      e is None or isinstance(e, str) for e in x
  )


def logical_to_sharding(
    axes_tree: PyTree,
    mesh: Mesh,
    rules: LogicalRules | None = None,
    shapes: PyTree | None = None,
) -> PyTree:
  """Maps a pytree of logical-name tuples to NamedShardings on `mesh`.

  Args:
    axes_tree: leaves are tuples of logical names (or None), one per dim.
    mesh: the device mesh; rule axes missing from it are dropped.
    rules: the rule table; default: the current `logical_rules` context.
    shapes: optional same-structure pytree of arrays / ShapeDtypeStructs. With
      it, indivisible dimensions fall back as the module docstring says.
  """
  sizes = dict(mesh.shape)
  to_sharding = lambda names, shape=None: NamedSharding(
      mesh, _fit_spec(names, shape, sizes, rules)
  )
  if shapes is None:
    return jax.tree.map(to_sharding, axes_tree, is_leaf=_is_names)
  names_leaves, treedef = jax.tree.flatten(axes_tree, is_leaf=_is_names)
  shape_leaves, shape_def = jax.tree.flatten(shapes)
  if treedef.num_leaves != shape_def.num_leaves:
    raise ValueError(
        f"axes tree has {treedef.num_leaves} leaves but the shapes tree has "
        f"{shape_def.num_leaves}: {treedef} vs {shape_def}"
    )
  out = [to_sharding(n, s.shape) for n, s in zip(names_leaves, shape_leaves)]
  return jax.tree.unflatten(shape_def, out)


def shard(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
  """Constrains activation `x` to the sharding its logical `names` imply.

  A no-op when no mesh is set (`jax.set_mesh`), so model code runs unchanged on
  one device. Mesh axes not present in the current mesh are dropped, and so
  are axes that do not divide their dimension (module docstring).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  if len(names) != x.ndim:
    raise ValueError(f"{len(names)} logical names {names} for shape {x.shape}")
  spec = _fit_spec(names, x.shape, dict(mesh.shape), None)
  return jax.lax.with_sharding_constraint(x, spec)


def init_sharded(
    init_fn: Callable[..., PyTree],
    axes: PyTree,
    mesh: Mesh,
    *args: Any,
    rules: LogicalRules | None = None,
) -> PyTree:
  """Runs `init_fn(*args)` with every output born sharded on `mesh`.

  Shapes come from `jax.eval_shape`, shardings from `axes` (same structure as
  the output) and the rules, and the one jitted init writes each shard on its
  device: no parameter is ever materialised whole on one device. Bind static
  arguments (configs, dtypes) with functools.partial; `args` are traced.
  """
  rules = current_rules() if rules is None else rules
  with logical_rules(rules), jax.set_mesh(mesh):
    abstract = jax.eval_shape(init_fn, *args)
    shardings = logical_to_sharding(axes, mesh, rules, shapes=abstract)
    return jax.jit(init_fn, out_shardings=shardings)(*args)


def follow_shardings(tree: PyTree, like: PyTree, mesh: Mesh) -> PyTree:
  """Shardings for `tree` that follow those of `like` (e.g. the params).

  A leaf of `tree` takes the sharding of the `like` leaf whose key path is the
  longest suffix of its own path and whose shape is the same (so adam's
  `mu["w"]` follows `params["w"]`); every other leaf, scalars included, is
  replicated on `mesh`. Leaves of `like` need `.shape` and `.sharding`.
  """
  by_path = {
      tuple(path): leaf
      for path, leaf in jax.tree_util.tree_flatten_with_path(like)[0]
  }
  replicated = NamedSharding(mesh, PartitionSpec())

  def pick(path, leaf):
    path = tuple(path)
    for start in range(len(path) + 1):
      match = by_path.get(path[start:])
      if match is not None and tuple(match.shape) == tuple(leaf.shape):
        return match.sharding
    return replicated

  return jax.tree_util.tree_map_with_path(pick, tree)


def init_opt_state_sharded(tx: Any, params: PyTree, mesh: Mesh) -> PyTree:
  """`tx.init(params)` with its state sharded as `follow_shardings` says."""
  abstract = jax.eval_shape(tx.init, params)
  shardings = follow_shardings(abstract, params, mesh)
  return jax.jit(tx.init, out_shardings=shardings)(params)


def assert_params_sharded(
    tree: PyTree,
    min_size: int = 2**14,
    over: Sequence[str] = ("fsdp", "tensor"),
) -> None:
  """Raises AssertionError if a large leaf is left whole on every device.

  A leaf with at least `min_size` elements must be on a mesh (a NamedSharding)
  and, when that mesh's `over` (parameter-sharding) axes have total size > 1,
  hold less than its whole shape per device. Pure data-parallel meshes (every
  `over` axis of size 1) pass by construction. The message lists every
  offender with its path, shape and spec.
  """
  bad = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if math.prod(leaf.shape) < min_size:
      continue
    sharding = getattr(leaf, "sharding", None)
    where = f"{jax.tree_util.keystr(path)} {tuple(leaf.shape)}"
    if not isinstance(sharding, NamedSharding):
      bad.append(f"{where}: not on a mesh ({sharding})")
    elif math.prod(dict(sharding.mesh.shape).get(a, 1) for a in over) == 1:
      continue
    elif tuple(sharding.shard_shape(leaf.shape)) == tuple(leaf.shape):
      bad.append(f"{where}: {sharding.spec}")
  if bad:
    raise AssertionError(
        f"{len(bad)} leaves of >= {min_size} elements are not sharded over "
        f"{tuple(over)}:\n  "
        + "\n  ".join(bad)
    )
