#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker (--worker=all); JAX detects the slice.
#   launch/tpu_pod.sh my-tpu us-central2-b configs/cub_ste.py --workdir=gs://bucket/runs/cub_ste
# The repository must already be on every worker (e.g. cloned by a startup script) at ~/metonymy.
set -euo pipefail
tpu_name="${1:?usage: launch/tpu_pod.sh TPU_NAME ZONE CONFIG [main.py flags...]}"
zone="${2:?zone}"
config="${3:?config}"
shift 3
gcloud compute tpus tpu-vm ssh "${tpu_name}" --zone="${zone}" --worker=all --command="
  cd ~/metonymy && python -m metonymy.main --config=${config} $(printf '%q ' "$@")"
