#!/usr/bin/env bash
# Runs a command beside N busy processes, so a suite can be tried under the load CI puts on it.
#
#   tests/harness/with-load.sh N COMMAND [ARGS...]
#
# Each busy process spins at nice 0, as a test build or a suite's control plane would, and adds
# one to the load average for as long as the command runs; all of them are stopped when it ends,
# however it ends. The command's exit status is this script's. On CI's two cores three lanes of
# suites, the Go builds and clippy keep the load average between 8 and 16: `HOMELAB_TEST_LOAD=8
# make test` (run-tests.sh calls this script) or `tests/harness/with-load.sh 8 cargo test --test
# NAME` puts a change through about that. While it runs it prints the load average every minute.
set -euo pipefail

if [[ $# -lt 2 || ! $1 =~ ^[0-9]+$ ]]; then
  echo "usage: with-load.sh N COMMAND [ARGS...]  (N busy processes beside COMMAND)" >&2
  exit 2
fi
count=$1
shift

busy=()
stop_load() {
  if [[ ${#busy[@]} -gt 0 ]]; then
    kill "${busy[@]}" 2>/dev/null || true
    wait "${busy[@]}" 2>/dev/null || true
    busy=()
  fi
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

for ((i = 0; i < count; i++)); do
  nice -n 0 bash -c 'while :; do :; done' &
  busy+=("$!")
done
if ((count > 0)); then
  (
    while sleep 60; do
      echo "with-load: $count busy processes; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    done
  ) &
  busy+=("$!")
  echo "with-load: started $count busy processes beside: $*" >&2
fi

status=0
"$@" || status=$?
echo "with-load: done with $count busy processes; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
exit "$status"
