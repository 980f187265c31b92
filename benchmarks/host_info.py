"""What the benchmark ran on: the CPU by name, family and model, clock, ISA.

The development hosts of this project change hardware between sessions
under the same "AMD EPYC, 2 cores" label: a jitted 2048x2048 float32 matmul
gave 351 GFLOP/s on one and 171-188 on another (a 2.6 GHz family-25
model-17 part, whose two cores top out near 2 x 32 f32 FLOP/cycle x 2.6
GHz = 166 GFLOP/s without turbo), and the ratios to PyTorch moved with
it. Every report therefore names the CPU, so that a table says which
machine its ratios belong to.
"""

import os
import pathlib
import platform

_CPUINFO = pathlib.Path("/proc/cpuinfo")


def cpu_fields(text: str) -> dict[str, str]:
  """The first processor's `key: value` lines of a /proc/cpuinfo text."""
  fields = {}
  for line in text.splitlines():
    if not line.strip():
      if fields:
        break  # the end of the first processor's block
      continue
    key, sep, value = line.partition(":")
    if sep:
      fields[key.strip()] = value.strip()
  return fields


def describe(cpuinfo_text: str | None = None) -> str:
  """E.g. 'x86_64, 2 cores, AMD EPYC (family 25 model 17, 2596 MHz, AVX-512)'.

  Falls back to the architecture and core count where /proc/cpuinfo is
  absent (macOS) or lacks the fields (ARM).
  """
  base = f"{platform.machine()}, {os.cpu_count()} cores"
  if cpuinfo_text is None:
    try:
      cpuinfo_text = _CPUINFO.read_text()
    except OSError:
      return base
  f = cpu_fields(cpuinfo_text)
  name = f.get("model name")
  if not name:
    return base
  details = []
  if "cpu family" in f and "model" in f:
    details.append(f"family {f['cpu family']} model {f['model']}")
  if "cpu MHz" in f:
    details.append(f"{float(f['cpu MHz']):.0f} MHz")
  flags = set(f.get("flags", "").split())
  if "avx512f" in flags:
    details.append("AVX-512")
  elif "avx2" in flags:
    details.append("AVX2")
  return f"{base}, {name}" + (f" ({', '.join(details)})" if details else "")
