#!/usr/bin/env bash
# A Cloud TPU pod slice: the same command on every worker (--worker=all); JAX detects the slice.
#   launch/tpu_pod.sh my-tpu us-central2-b configs/cub_ste.py --workdir=gs://bucket/runs/cub_ste
#   launch/tpu_pod.sh --restart=20 my-tpu us-central2-b configs/cub_ste.py --workdir=gs://...
# First, on every worker (as big_vision's instructions do): this checkout's HEAD (git archive) is
# copied to ~/metonymy and installed with jax[tpu] and requirements.txt; --no-sync skips that
# (the package is already there, e.g. from a startup script). The workdir must be on storage that
# outlives the workers (a gs:// bucket). METONYMY_DRY_RUN=1 prints the gcloud commands instead
# of running them.
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
usage="usage: launch/tpu_pod.sh [--restart=N] [--no-sync] TPU_NAME ZONE CONFIG [main.py flags...]"
restarts=0
sync=1
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --restart=*) restarts="${1#--restart=}" ;;
    --no-sync) sync=0 ;;
    *) echo "tpu_pod.sh: unknown option $1; ${usage}" >&2; exit 2 ;;
  esac
  shift
done
if [[ ! "${restarts}" =~ ^[0-9]+$ ]]; then
  echo "tpu_pod.sh: --restart needs a number, got '${restarts}'; ${usage}" >&2
  exit 2
fi
tpu_name="${1:?${usage}}"
zone="${2:?${usage}}"
config="${3:?${usage}}"
shift 3
requeue_status=75  # metonymy/training/preemption.py: REQUEUE_EXIT_CODE.

gcloud_() {
  if [[ -n "${METONYMY_DRY_RUN:-}" ]]; then
    printf '+ gcloud'
    printf ' %q' "$@"
    printf '\n'
  else
    gcloud "$@"
  fi
}

state() {
  gcloud_ compute tpus tpu-vm describe "${tpu_name}" --zone="${zone}" --format='value(state)' \
      2>/dev/null || echo MISSING
}

if ((sync)); then
  archive="$(mktemp --suffix=.tar.gz)"
  trap 'rm -f "${archive}"' EXIT
  git -C "$(dirname "$0")/.." archive --format=tar.gz -o "${archive}" HEAD
  gcloud_ compute tpus tpu-vm scp "${archive}" "${tpu_name}:~/metonymy.tar.gz" --zone="${zone}" \
      --worker=all
  gcloud_ compute tpus tpu-vm ssh "${tpu_name}" --zone="${zone}" --worker=all --command="
    rm -rf ~/metonymy && mkdir -p ~/metonymy && tar -xzf ~/metonymy.tar.gz -C ~/metonymy &&
    cd ~/metonymy && python3 -m pip install -q 'jax[tpu]' -r requirements.txt &&
    python3 -m pip install -q --no-deps -e ."
fi

for ((attempt = 0; ; attempt++)); do
  status=0
  gcloud_ compute tpus tpu-vm ssh "${tpu_name}" --zone="${zone}" --worker=all --command="
    cd ~/metonymy && python3 -m metonymy.main --config=${config} $(printf '%q ' "$@")" \
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
