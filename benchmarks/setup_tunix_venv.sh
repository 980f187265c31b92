#!/usr/bin/env bash
# Creates .venv-tunix (gitignored) with google-tunix 0.1.7 for the Tunix side of
# benchmarks/bench_foundation.py. Tunix cannot share the main venv: it needs
# safetensors<0.8, which forces an older transformers (STACK_NOTES.md §7).
# Usage: bash benchmarks/setup_tunix_venv.sh [VENV_DIR]   (default .venv-tunix)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv-tunix}"
python="${PYTHON:-python3.11}"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import tunix" 2>/dev/null; then
  echo "$venv already has tunix"
  exit 0
fi
"$python" -m venv "$venv"
# Same jax/flax as the main venv, so that both sides run the same XLA.
"$venv/bin/pip" install -q \
  "google-tunix==0.1.7" "jax==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" \
  "safetensors==0.7.0" "numpy>=2.0"
"$venv/bin/python" -c "import tunix, jax; print('tunix ok, jax', jax.__version__)"
