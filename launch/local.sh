#!/usr/bin/env bash
# N processes of one job on this machine (JAX's CPU collectives use gloo), e.g. to test
# multi-host code paths without a cluster:
#   launch/local.sh 2 --config=configs/synthetic_single.py:runlocal --workdir=/tmp/run
# Process 0 prints to the terminal; process i > 0 logs to /tmp/metonymy_local_<i>.log.
set -euo pipefail
num_processes="${1:?usage: launch/local.sh NUM_PROCESSES [main.py flags...]}"
shift
port="${METONYMY_PORT:-$((20000 + RANDOM % 20000))}"
pids=()
for ((i = num_processes - 1; i >= 0; i--)); do
  env METONYMY_COORDINATOR="127.0.0.1:${port}" METONYMY_NUM_PROCESSES="${num_processes}" \
      METONYMY_PROCESS_ID="${i}" python -m metonymy.main "$@" \
      > >(if [[ $i == 0 ]]; then cat; else cat > "/tmp/metonymy_local_${i}.log"; fi) 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
