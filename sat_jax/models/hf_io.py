"""Hugging Face safetensors checkpoints: load from and save to a local folder.

A folder holds config.json plus either model.safetensors or shards named in
model.safetensors.index.json. Loading checks every tensor's presence and
shape from the file headers before it reads any data, so a bad folder fails
with one clear error and nothing half-loaded. Saving writes a temporary
sibling folder and renames it into place.
"""

import contextlib
import json
import math
import os
import pathlib
import shutil
import uuid
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from sat_jax import io_utils
from sat_jax.models import config as config_lib
from sat_jax.models import transformer

ModelConfig = config_lib.ModelConfig
PyTree = Any

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 4 * 2**30

_DTYPES = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F16": np.float16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
  """A checkpoint folder is missing files or tensors, or has wrong shapes."""


def _hf_table(config: ModelConfig) -> dict[str, tuple[str, Callable, Callable]]:
  """Our layer param -> (HF suffix, ours->HF, HF->ours), per layer slice."""
  d, hd = config.hidden_size, config.head_dim
  h, k = config.num_heads, config.num_kv_heads

  def proj(n):  # [D, N, Hd] <-> [N * Hd, D]
    return (
        lambda w: w.reshape(d, n * hd).T,
        lambda w: w.T.reshape(d, n, hd),
    )

  t = lambda w: w.T  # pylint: disable=unnecessary-lambda-assignment
  same = lambda w: w  # pylint: disable=unnecessary-lambda-assignment
  table = {
      "attn_norm": ("input_layernorm.weight", same, same),
      "mlp_norm": ("post_attention_layernorm.weight", same, same),
      "q_proj": ("self_attn.q_proj.weight", *proj(h)),
      "k_proj": ("self_attn.k_proj.weight", *proj(k)),
      "v_proj": ("self_attn.v_proj.weight", *proj(k)),
      "o_proj": (
          "self_attn.o_proj.weight",
          lambda w: w.reshape(h * hd, d).T,
          lambda w: w.T.reshape(h, hd, d),
      ),
      "gate_proj": ("mlp.gate_proj.weight", t, t),
      "up_proj": ("mlp.up_proj.weight", t, t),
      "down_proj": ("mlp.down_proj.weight", t, t),
  }
  for name, n in (("q", h), ("k", k), ("v", k)):
    table[f"{name}_bias"] = (
        f"self_attn.{name}_proj.bias",
        lambda w: w.reshape(-1),
        lambda w, n=n: w.reshape(n, hd),
    )
  for name in ("q_norm", "k_norm"):
    table[name] = (f"self_attn.{name}.weight", same, same)
  return table


_TOP = {
    "embed": ("model.embed_tokens.weight", lambda w: w, lambda w: w),
    "final_norm": ("model.norm.weight", lambda w: w, lambda w: w),
    "lm_head": ("lm_head.weight", lambda w: w.T, lambda w: w.T),
}


def _expected(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple]]:
  """HF tensor name -> (HF shape, where it goes: (top,) or (layer, i))."""
  shapes = transformer.param_shapes(config)
  out = {}
  for name, shape in shapes.items():
    if name == "layers":
      continue
    hf_name, to_hf, _ = _TOP[name]
    out[hf_name] = (to_hf(np.empty(shape, np.int8)).shape, (name,))
  table = _hf_table(config)
  for name, shape in shapes["layers"].items():
    suffix, to_hf, _ = table[name]
    hf_shape = to_hf(np.empty(shape[1:], np.int8)).shape
    for i in range(config.num_layers):
      out[f"model.layers.{i}.{suffix}"] = (hf_shape, (name, i))
  return out


def _weight_files(path: pathlib.Path) -> dict[str, pathlib.Path]:
  """Tensor name -> file, from the index or the single file's header."""
  index = path / INDEX_FILE
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
      raise CheckpointError(f"{index}: not a safetensors index ({e})") from e
    files = {n: path / f for n, f in weight_map.items()}
    for f in sorted(set(files.values())):
      if not f.is_file():
        raise CheckpointError(f"{index} names {f.name}, which is missing")
    return files
  single = path / SINGLE_FILE
  if not single.is_file():
    raise CheckpointError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE}")
  with safe_open(single, framework="np") as f:
    return {n: single for n in f.keys()}


def _check_tensors(config, path, files) -> dict[str, tuple[str, str]]:
  """Raises CheckpointError listing every missing, extra or mis-shaped one."""
  expected = _expected(config)
  found: dict[str, tuple[tuple[int, ...], str]] = {}
  for file in sorted(set(files.values())):
    with safe_open(file, framework="np") as f:
      for name in f.keys():
        s = f.get_slice(name)
        found[name] = (tuple(s.get_shape()), s.get_dtype())
  problems = []
  for name, (shape, _) in expected.items():
    if name not in found or name not in files:
      problems.append(f"missing tensor {name} (expected shape {shape})")
    elif found[name][0] != shape:
      problems.append(
          f"tensor {name} has shape {found[name][0]}, expected {shape}"
      )
    elif found[name][1] not in _DTYPES:
      problems.append(f"tensor {name} has unsupported dtype {found[name][1]}")
  for name in sorted(set(found) - set(expected)):
    tied_head = name == "lm_head.weight" and config.tie_embeddings
    if not tied_head and not name.endswith(_IGNORED_SUFFIXES):
      problems.append(f"unexpected tensor {name} {found[name][0]}")
  if problems:
    shown = "\n  ".join(problems[:20])
    more = (
        f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
    )
    raise CheckpointError(
        f"{path}: bad checkpoint for {config}:\n  {shown}{more}"
    )
  return expected


def load_hf(
    path: str | os.PathLike,
    dtype: Any = jnp.float32,
    *,
    shardings: PyTree | None = None,
) -> tuple[ModelConfig, PyTree]:
  """Reads (config, params) from a local Hugging Face checkpoint folder.

  `dtype=None` keeps the stored dtype. `shardings` (a tree like the params)
  places each array directly with `jax.device_put`.
  """
  path = pathlib.Path(path)
  config = config_lib.config_from_hf(path)
  files = _weight_files(path)
  expected = _check_tensors(config, path, files)
  table = _hf_table(config)
  stacks: dict[str, list] = {n: [None] * config.num_layers for n in table}
  params: dict[str, Any] = {"layers": {}}
  with contextlib.ExitStack() as stack:
    handles = {
        f: stack.enter_context(safe_open(f, framework="np"))
        for f in sorted(set(files.values()))
    }
    for name, (_, where) in expected.items():
      w = handles[files[name]].get_tensor(name)
      if dtype is not None:
        w = w.astype(jnp.dtype(dtype), copy=False)
      if len(where) == 1:
        params[where[0]] = _TOP[where[0]][2](w)
      else:
        stacks[where[0]][where[1]] = table[where[0]][2](w)
  for name, parts in stacks.items():
    if parts[0] is not None:
      params["layers"][name] = np.stack(parts)
  if shardings is None:
    return config, jax.tree.map(jnp.asarray, params)
  return config, jax.tree.map(jax.device_put, params, shardings)


def _hf_tensors(config: ModelConfig, params: PyTree):
  """Yields (HF name, getter of the HF-layout host array), in file order."""
  table = _hf_table(config)

  def host(x):
    return np.asarray(jax.device_get(x))

  yield "model.embed_tokens.weight", lambda: host(params["embed"])
  for i in range(config.num_layers):
    for name in sorted(params["layers"]):
      suffix, to_hf, _ = table[name]
      w = params["layers"][name]
      yield f"model.layers.{i}.{suffix}", lambda w=w, f=to_hf, i=i: f(
          host(w[i])
      )
  yield "model.norm.weight", lambda: host(params["final_norm"])
  if not config.tie_embeddings:
    yield "lm_head.weight", lambda: host(params["lm_head"]).T


def _check_params(config: ModelConfig, params: PyTree) -> None:
  want = transformer.param_shapes(config)
  want_flat = dict(jax.tree_util.tree_leaves_with_path(want, is_leaf=_is_shape))
  got_flat = dict(jax.tree_util.tree_leaves_with_path(params))
  for key in sorted(set(want_flat) | set(got_flat), key=str):
    name = jax.tree_util.keystr(key)
    if key not in got_flat:
      raise CheckpointError(f"params lack {name} {want_flat[key]}")
    if key not in want_flat:
      raise CheckpointError(f"params have unexpected {name}")
    if tuple(got_flat[key].shape) != tuple(want_flat[key]):
      raise CheckpointError(
          f"params{name} has shape {tuple(got_flat[key].shape)}, expected"
          f" {tuple(want_flat[key])}"
      )


def _is_shape(x) -> bool:
  return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def save_hf(
    path: str | os.PathLike,
    config: ModelConfig,
    params: PyTree,
    dtype: Any = None,
    *,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    extra_config: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> pathlib.Path:
  """Writes config.json and safetensors that transformers loads as is.

  `dtype=None` keeps the params' dtype. Above `max_shard_bytes` the weights
  are split into model-0000i-of-0000n.safetensors plus an index.
  `extra_config` adds keys such as token ids to config.json. The folder is
  built under a temporary name and renamed into place; an existing folder is
  replaced only with `overwrite=True`.
  """
  path = pathlib.Path(path)
  if path.exists() and not overwrite:
    raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")
  _check_params(config, params)
  leaves = jax.tree.leaves(params)
  out_dtype = np.dtype(
      jnp.dtype(dtype if dtype is not None else leaves[0].dtype)
  )
  hf_config = config_lib.config_to_hf(config, str(jnp.dtype(out_dtype)))
  for key, value in dict(extra_config or {}).items():
    if key in hf_config and hf_config[key] != value:
      raise config_lib.ConfigError(f"extra_config[{key!r}] contradicts config")
    hf_config[key] = value

  hf_shapes = {n: shape for n, (shape, _) in _expected(config).items()}
  tensors = list(_hf_tensors(config, params))
  shards: list[list[tuple[str, Callable]]] = [[]]
  size = 0
  for name, get in tensors:
    nbytes = math.prod(hf_shapes[name]) * out_dtype.itemsize
    if shards[-1] and size + nbytes > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append((name, get))
    size += nbytes

  tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
  tmp.mkdir(parents=True)
  try:
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
      fname = (
          SINGLE_FILE
          if len(shards) == 1
          else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      )
      arrays = {
          n: np.ascontiguousarray(g().astype(out_dtype, copy=False))
          for n, g in shard
      }
      save_file(arrays, tmp / fname, metadata={"format": "pt"})
      for n, a in arrays.items():
        weight_map[n] = fname
        total += a.nbytes
    if len(shards) > 1:
      index = {"metadata": {"total_size": total}, "weight_map": weight_map}
      io_utils.atomic_write_json(tmp / INDEX_FILE, index)
    io_utils.atomic_write_json(tmp / "config.json", hf_config)
    _replace_dir(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


def _replace_dir(src: pathlib.Path, dst: pathlib.Path) -> None:
  if not dst.exists():
    os.replace(src, dst)
    return
  old = dst.parent / f".{dst.name}.old-{uuid.uuid4().hex[:8]}"
  os.replace(dst, old)
  os.replace(src, dst)
  shutil.rmtree(old, ignore_errors=True)
