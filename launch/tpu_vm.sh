#!/usr/bin/env bash
# Create / run on / delete a Cloud TPU VM slice. The repo is copied to every
# worker and launch/run.sh runs there with SAT_JAX_DISTRIBUTED=1.
#
#   launch/tpu_vm.sh create NAME ZONE ACCELERATOR_TYPE [RUNTIME_VERSION]
#   launch/tpu_vm.sh run    NAME ZONE -- train --config experiments/demo.py --workdir /mnt/shared/run
#   launch/tpu_vm.sh delete NAME ZONE
#
# The workdir is a folder every worker mounts (NFS, or a gcsfuse mount of a
# bucket): run files are written by worker 0 with local file operations.
set -euo pipefail
cmd=${1:?"usage: tpu_vm.sh create|run|delete NAME ZONE ..."}
name=${2:?"missing NAME"}
zone=${3:?"missing ZONE"}
shift 3
case "$cmd" in
  create)
    accel=${1:?"missing ACCELERATOR_TYPE, e.g. v5litepod-16"}
    runtime=${2:-v2-alpha-tpuv5-lite}
    gcloud compute tpus tpu-vm create "$name" --zone "$zone" \
      --accelerator-type "$accel" --version "$runtime" ;;
  run)
    [ "${1:-}" = "--" ] && shift
    repo="$(cd "$(dirname "$0")/.." && pwd)"
    gcloud compute tpus tpu-vm scp --recurse --zone "$zone" --worker=all \
      "$repo" "$name":~/sat_jax
    args=$(printf '%q ' "$@")
    gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all --command \
      "cd ~/sat_jax && SAT_JAX_DISTRIBUTED=1 launch/run.sh --accelerator tpu -- $args" ;;
  delete)
    gcloud compute tpus tpu-vm delete "$name" --zone "$zone" --quiet ;;
  *) echo "tpu_vm.sh: unknown command $cmd (create, run, delete)" >&2; exit 2 ;;
esac
