"""benchmarks/host_info.py: the CPU named in every benchmark report."""

import os
import pathlib
import platform
import sys

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parent.parent / "benchmarks")
)

import host_info  # pylint: disable=g-import-not-at-top,wrong-import-position

# Two processors of a Linux /proc/cpuinfo, shortened; the second differs so
# that reading past the first block would show.
_X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
cpu MHz\t\t: 2596.146
flags\t\t: fpu sse avx avx2 avx512f avx512bw

processor\t: 1
cpu family\t: 26
model\t\t: 2
model name\t: Other CPU
cpu MHz\t\t: 3700.000
flags\t\t: fpu sse
"""

_ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd
CPU implementer\t: 0x41
"""


def _base() -> str:
  return f"{platform.machine()}, {os.cpu_count()} cores"


def test_the_first_processor_is_described():
  assert host_info.describe(_X86) == (
      f"{_base()}, AMD EPYC (family 25 model 17, 2596 MHz, AVX-512)"
  )


def test_avx2_without_avx512_and_missing_fields():
  text = "model name\t: Some CPU\nflags\t\t: sse avx2\n"
  assert host_info.describe(text) == f"{_base()}, Some CPU (AVX2)"
  assert host_info.describe("model name\t: Bare\n") == f"{_base()}, Bare"


def test_no_model_name_falls_back_to_the_core_count():
  assert host_info.describe(_ARM) == _base()
  assert host_info.describe("") == _base()
