"""Team checkpoints: one orbax item per agent, its metadata, and a cursor.

Layout of a step directory (an orbax `CheckpointManager` step):

  <dir>/<step>/team/          {"num_agents": n, "format": 1}        JSON
              /cursor/        the team cursor, e.g. {"stage", "order", ...}
              /agent_<j>/     agent j's state pytree (params, optax state, ...)
              /agent_<j>_meta small JSON metadata of agent j

Because each agent is its own item, one agent can be restored alone and a new
step can be written in which only one slot changed (the plug-and-play swap).

Crash safety: orbax writes a step into `<step>.orbax-checkpoint-tmp-*` and
renames it into place when complete, so a killed save leaves only a temporary
directory, which is never listed and is removed on the next start. Old steps
(beyond `max_to_keep`) are first renamed into `<dir>/_trash` (atomic) and only
then deleted: orbax's default in-place recursive delete, if killed, would leave
a half-deleted step under a valid step name, listed but unrestorable. (That
rename is what orbax does on local/POSIX file systems, where the kill -9 test
runs; on GCS orbax deletes in place.)

Agent states are pytrees of jax Arrays (params, optax states, scalars such as
beta and delta). A restore always takes targets that carry shardings, so
where the arrays land is never guessed from the saving topology. JSON values
come back as JSON: tuples in metadata or the cursor return as lists.
"""

import json
import os
from typing import Any, Mapping, Sequence

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp

PyTree = Any
FORMAT_VERSION = 1
_TRASH = "_trash"


class CheckpointError(ValueError):
  """A step, agent or target does not match what the directory holds."""


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _leaf_table(tree: PyTree) -> dict[str, Any]:
  """Leaves by '/'-joined path; NamedTuple fields and dict keys agree."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(_key_name(k) for k in path): x for path, x in leaves}


def _abstract(x: Any) -> Any:
  if isinstance(x, jax.ShapeDtypeStruct):
    return x
  return ocp.utils.to_shape_dtype_struct(x)


def _check_json(value: Any, what: str) -> None:
  try:
    json.dumps(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{what} is not JSON-serialisable: {e}") from e
  if not isinstance(value, Mapping):
    raise ValueError(f"{what} must be a dict, got {type(value).__name__}")


def _agent(j: int) -> str:
  return f"agent_{j}"


def _meta(j: int) -> str:
  return f"agent_{j}_meta"


class TeamCheckpointer:
  """Saves and restores teams of agent states under one directory.

  Steps are whatever the caller counts (e.g. SAT stages). Saves are
  asynchronous by default: `save` returns once the arrays are copied off the
  devices; `wait_until_finished` blocks until the step is on disk.
  """

  def __init__(
      self,
      directory: str | os.PathLike,
      *,
      max_to_keep: int | None = None,
      async_save: bool = True,
      read_only: bool = False,
  ):
    """`read_only` (a reader such as `sat-jax eval`, possibly beside a live
    run): no save, and the folder is left as it is. A writer removes
    leftover temporary step folders on start, which would destroy a save
    that the training process has in flight."""
    if max_to_keep is not None and max_to_keep < 1:
      raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
    directory = os.fspath(directory)
    if "://" not in directory:  # orbax wants absolute local paths
      directory = os.path.abspath(directory)
    self.directory = epath.Path(directory)
    self.read_only = read_only
    if read_only and not self.directory.is_dir():
      raise CheckpointError(f"{self.directory}: no checkpoint folder")
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if read_only else max_to_keep,
        enable_async_checkpointing=async_save,
        todelete_subdir=_TRASH,
        cleanup_tmp_directories=not read_only,
        create=not read_only,
        read_only=read_only,
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    if not read_only:
      self._empty_trash()

  def _empty_trash(self) -> None:
    trash = self.directory / _TRASH
    if jax.process_index() != 0 or not trash.is_dir():
      return
    for entry in trash.iterdir():
      entry.rmtree(missing_ok=True)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(
      self,
      step: int,
      agent_states: Sequence[PyTree],
      agent_metas: Sequence[Mapping[str, Any]],
      cursor: Mapping[str, Any],
  ) -> None:
    """Writes the team as step `step` (a new step; never overwrites)."""
    if self.read_only:
      raise CheckpointError(f"{self.directory} was opened read-only: no save")
    n = len(agent_states)
    if n == 0 or len(agent_metas) != n:
      raise ValueError(
          f"save(step={step}): {n} agent states and {len(agent_metas)} "
          "metas; need the same number, at least one"
      )
    for j, meta in enumerate(agent_metas):
      _check_json(meta, f"metadata of agent {j}")
    _check_json(cursor, "cursor")
    if step in self.all_steps():
      raise CheckpointError(f"step {step} already exists in {self.directory}")
    self._empty_trash()
    items = {
        "team": ocp.args.JsonSave({"num_agents": n, "format": FORMAT_VERSION}),
        "cursor": ocp.args.JsonSave(dict(cursor)),
    }
    for j in range(n):
      items[_agent(j)] = ocp.args.StandardSave(agent_states[j])
      items[_meta(j)] = ocp.args.JsonSave(dict(agent_metas[j]))
    self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    logging.info("team checkpoint: saving step %d (%d agents)", step, n)

  def _check_step(self, step: int) -> int:
    """The number of agents of `step`; a clear error when it is absent."""
    self._manager.wait_until_finished()  # a step saved just now is readable
    steps = self.all_steps()
    if step not in steps:
      raise CheckpointError(
          f"no step {step} in {self.directory}; steps there: {steps}"
      )
    if not (self.directory / str(step) / "team").is_dir():
      raise CheckpointError(
          f"step {step} in {self.directory} is not a team checkpoint (no "
          "'team' item)"
      )
    team = self._manager.restore(
        step, args=ocp.args.Composite(team=ocp.args.JsonRestore())
    ).team
    if team.get("format") != FORMAT_VERSION:
      raise CheckpointError(
          f"step {step} in {self.directory}: team format {team.get('format')}"
          f", expected {FORMAT_VERSION}"
      )
    return int(team["num_agents"])

  def num_agents(self, step: int) -> int:
    return self._check_step(step)

  def restore_cursor(self, step: int) -> dict[str, Any]:
    self._check_step(step)
    args = ocp.args.Composite(cursor=ocp.args.JsonRestore())
    return self._manager.restore(step, args=args).cursor

  def _saved_tree(self, step: int, j: int) -> PyTree:
    """Agent j's saved tree of orbax ArrayMetadata (shape, dtype, sharding).

    Read with a standalone handler: a manager that has not saved these items
    in this process knows no handler for them. Step directories are named
    by the bare step number (the manager's default name format).
    """
    item_dir = self.directory / str(step) / _agent(j)
    return ocp.StandardCheckpointHandler().metadata(item_dir).tree

  def _checked_target(self, step: int, j: int, target: PyTree) -> PyTree:
    """`target` as ShapeDtypeStructs, after matching it to the saved leaves."""
    abstract = jax.tree.map(_abstract, target)
    saved = _leaf_table(self._saved_tree(step, j))
    wanted = _leaf_table(abstract)
    where = f"step {step}, agent {j}"
    if saved.keys() != wanted.keys():
      missing = sorted(saved.keys() - wanted.keys())
      extra = sorted(wanted.keys() - saved.keys())
      raise CheckpointError(
          f"{where}: target structure differs from the saved one; "
          f"saved only: {missing[:5]}, target only: {extra[:5]}"
      )
    for path, want in wanted.items():
      if want.sharding is None:
        raise CheckpointError(
            f"{where}, leaf {path!r}: the target has no sharding; give "
            "jax.ShapeDtypeStruct(shape, dtype, sharding=...) or an array"
        )
      have = saved[path]
      have_sd = (tuple(have.shape), jax.numpy.dtype(have.dtype))
      if have_sd != (tuple(want.shape), jax.numpy.dtype(want.dtype)):
        raise CheckpointError(
            f"{where}, leaf {path!r}: saved {have_sd[0]} {have_sd[1]}, "
            f"target {tuple(want.shape)} {want.dtype}"
        )
    return abstract

  def _check_agent_index(self, step: int, j: int, n: int) -> None:
    if not 0 <= j < n:
      raise CheckpointError(
          f"agent index {j} out of range: step {step} holds {n} agents"
      )

  def restore(
      self, step: int, targets: Sequence[PyTree]
  ) -> tuple[tuple[PyTree, ...], tuple[dict, ...], dict]:
    """(agent_states, agent_metas, cursor) of `step`.

    `targets[j]` gives agent j's structure, shapes, dtypes and shardings:
    ShapeDtypeStructs with `sharding=` (or arrays), so the team lands on any
    mesh, whatever mesh it was saved from.
    """
    n = self._check_step(step)
    if len(targets) != n:
      raise CheckpointError(
          f"step {step} holds {n} agents, got {len(targets)} targets"
      )
    items = {"cursor": ocp.args.JsonRestore()}
    for j, target in enumerate(targets):
      abstract = self._checked_target(step, j, target)
      items[_agent(j)] = ocp.args.StandardRestore(abstract)
      items[_meta(j)] = ocp.args.JsonRestore()
    out = self._manager.restore(step, args=ocp.args.Composite(**items))
    states = tuple(out[_agent(j)] for j in range(n))
    metas = tuple(out[_meta(j)] for j in range(n))
    return states, metas, out.cursor

  def restore_agent(
      self, step: int, j: int, target: PyTree
  ) -> tuple[PyTree, dict]:
    """(state, meta) of agent `j` at `step`, onto `target`'s shardings."""
    self._check_agent_index(step, j, self._check_step(step))
    abstract = self._checked_target(step, j, target)
    args = ocp.args.Composite(**{
        _agent(j): ocp.args.StandardRestore(abstract),
        _meta(j): ocp.args.JsonRestore(),
    })
    out = self._manager.restore(step, args=args)
    return out[_agent(j)], out[_meta(j)]

  def _saved_target(self, step: int, j: int) -> PyTree:
    """Agent j's saved tree as ShapeDtypeStructs on its saved shardings."""

    def to_struct(m):
      try:
        sharding = m.sharding.to_jax_sharding()
      except Exception as e:  # pylint: disable=broad-exception-caught
        raise CheckpointError(
            f"step {step}, agent {j}: the saved sharding {m.sharding} does "
            "not exist on these devices; pass `targets`"
        ) from e
      return jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding)

    return jax.tree.map(to_struct, self._saved_tree(step, j))

  def replace_agent(
      self,
      step: int,
      j: int,
      new_state: PyTree,
      new_meta: Mapping[str, Any],
      new_step: int,
      *,
      targets: Sequence[PyTree | None] | None = None,
      cursor: Mapping[str, Any] | None = None,
  ) -> None:
    """Writes `new_step`: the team of `step` with slot `j` replaced.

    The other agents are copied value for value. They are read onto
    `targets[i]` when given, else onto the shardings they were saved with
    (which needs the same devices). The cursor is copied unless `cursor` is
    given.
    """
    n = self._check_step(step)
    self._check_agent_index(step, j, n)
    if targets is not None and len(targets) != n:
      raise CheckpointError(
          f"step {step} holds {n} agents, got {len(targets)} targets"
      )
    if new_step in self.all_steps():
      raise CheckpointError(
          f"step {new_step} already exists in {self.directory}"
      )
    states, metas = [], []
    for i in range(n):
      if i == j:
        states.append(new_state)
        metas.append(new_meta)
        continue
      target = targets[i] if targets is not None else None
      target = self._saved_target(step, i) if target is None else target
      state, meta = self.restore_agent(step, i, target)
      states.append(state)
      metas.append(meta)
    if cursor is None:
      cursor = self.restore_cursor(step)
    self.save(new_step, states, metas, cursor)

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()
    self._empty_trash()

  def __enter__(self) -> "TeamCheckpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
