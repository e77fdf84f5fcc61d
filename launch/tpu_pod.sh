#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker (--worker=all); JAX detects the slice.
#   launch/tpu_pod.sh my-tpu us-central2-b configs/cub_ste.py --workdir=gs://bucket/runs/cub_ste
#   launch/tpu_pod.sh --restart=20 my-tpu us-central2-b configs/cub_ste.py --workdir=gs://...
# The repository must already be on every worker (e.g. cloned by a startup script) at ~/metonymy,
# and the workdir on storage that outlives the workers (a gs:// bucket).
#
# Spot / preemptible slices and maintenance events: the workers get SIGTERM (about 30 s ahead on
# spot VMs); the run saves at the next step on every worker and exits with status 75
# (metonymy/training/preemption.py). config.trainer.checkpoint_every_minutes bounds what is lost
# when the notice is too short for that save. With --restart=N this script then waits until the
# slice is READY again and reruns the command, which resumes from the newest checkpoint, at most
# N times; it restarts on status 75 and on a lost connection (255: the workers went away). A
# preempted spot slice does not come back by itself: recreate it (or let a queued resource do
# it) with the same name and the same startup script, and the waiting loop picks it up.
set -euo pipefail
restarts=0
if [[ "${1:-}" == --restart=* ]]; then
  restarts="${1#--restart=}"
  shift
fi
tpu_name="${1:?usage: launch/tpu_pod.sh [--restart=N] TPU_NAME ZONE CONFIG [main.py flags...]}"
zone="${2:?zone}"
config="${3:?config}"
shift 3
requeue_status=75  # metonymy/training/preemption.py: REQUEUE_EXIT_CODE.

state() {
  gcloud compute tpus tpu-vm describe "${tpu_name}" --zone="${zone}" --format='value(state)' \
      2>/dev/null || echo MISSING
}

for ((attempt = 0; ; attempt++)); do
  status=0
  gcloud compute tpus tpu-vm ssh "${tpu_name}" --zone="${zone}" --worker=all --command="
    cd ~/metonymy && python -m metonymy.main --config=${config} $(printf '%q ' "$@")" \
      || status=$?
  if [[ ${status} != "${requeue_status}" && ${status} != 255 ]]; then
    exit "${status}"  # Finished (0) or failed: nothing to restart.
  fi
  if ((attempt >= restarts)); then
    echo "tpu_pod.sh: status ${status} (preempted or lost); no restarts left (--restart=${restarts})"
    exit "${status}"
  fi
  echo "tpu_pod.sh: status ${status}; waiting for ${tpu_name} to be READY (now $(state))"
  until [[ "$(state)" == READY ]]; do sleep 60; done
  echo "tpu_pod.sh: restart $((attempt + 1)) of ${restarts} ($(date -Is))"
done
