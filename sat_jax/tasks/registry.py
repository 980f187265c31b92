"""Tasks by name: `@register("name")` on a Task class, `get_task(name, ...)`.

Every module of the `sat_jax.tasks` package is imported on the first lookup,
so a new domain module only needs the decorator to become available to
`sat-jax train` / `sat-jax eval` configs.
"""

import importlib
import pkgutil
from typing import Any, Callable, TypeVar

from sat_jax.tasks import base

_T = TypeVar("_T", bound=type)
_REGISTRY: dict[str, Callable[..., base.Task]] = {}
_SCANNED = False


def register(name: str) -> Callable[[_T], _T]:
  """Class decorator: makes `get_task(name, **kwargs)` build this task."""

  def wrap(cls: _T) -> _T:
    if name in _REGISTRY and _REGISTRY[name] is not cls:
      raise ValueError(f"task name {name!r} registered twice")
    _REGISTRY[name] = cls
    return cls

  return wrap


def _scan() -> None:
  global _SCANNED
  if _SCANNED:
    return
  package = importlib.import_module("sat_jax.tasks")
  for info in pkgutil.walk_packages(package.__path__, prefix="sat_jax.tasks."):
    importlib.import_module(info.name)
  _SCANNED = True


def names() -> list[str]:
  _scan()
  return sorted(_REGISTRY)


def get_task(name: str, **kwargs: Any) -> base.Task:
  """Builds the task registered as `name` with its keyword arguments."""
  _scan()
  if name not in _REGISTRY:
    raise ValueError(f"unknown task {name!r}; known tasks: {sorted(_REGISTRY)}")
  return _REGISTRY[name](**kwargs)
