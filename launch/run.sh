#!/usr/bin/env bash
# Per-host launcher: installs sat_jax into a venv on this host and runs one
# `sat-jax` command. On a TPU pod slice run it on every worker (see tpu_vm.sh);
# on a GPU host run it once. Multi-host runs set SAT_JAX_DISTRIBUTED=1 so that
# `sat-jax` calls jax.distributed.initialize() before touching devices.
#
#   launch/run.sh [--accelerator cpu|tpu|cuda12] -- train --config experiments/demo.py --workdir /mnt/shared/run
set -euo pipefail
accelerator=cpu
while [ $# -gt 0 ]; do
  case "$1" in
    --accelerator) accelerator="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "run.sh: unknown option $1 (expected --accelerator or --)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
venv=${SAT_JAX_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q -e .
case "$accelerator" in
  cpu) ;;
  tpu) "$venv/bin/pip" install -q "jax[tpu]==0.10.2" ;;
  cuda12) "$venv/bin/pip" install -q "jax[cuda12]==0.10.2" ;;
  *) echo "run.sh: unknown accelerator $accelerator (cpu, tpu, cuda12)" >&2; exit 2 ;;
esac
# The malloc setting of sat_jax.host_memory is for XLA on CPU; accelerator
# hosts keep glibc's defaults (their host threads load data).
[ "$accelerator" = cpu ] || export SAT_JAX_MALLOC="${SAT_JAX_MALLOC:-system}"
exec "$venv/bin/sat-jax" "$@"
