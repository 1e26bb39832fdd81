#!/usr/bin/env bash
# Runs the test executables `cargo test --workspace --all-targets` runs, several at a time.
# Most end-to-end suites wait on clocks (cluster-autoscaler's loop, kube-controller-manager's
# grace period, leases, boot delays), not on the CPU, so suites side by side finish in about
# the time of the longest lane instead of the sum of all.
#
#   tests/harness/run-tests.sh [NAME...] [-- ARGS...]
#
# NAME is a test target (`webhooks_claims`, `e2e_cluster_autoscaler`, `homelab_autoscaler` for the
# library's unit tests); without one every executable runs. ARGS go to each executable as
# after `cargo test ... --` (a test name filter, `--nocapture`).
#
# Each executable runs whole, in one process, as `cargo test` runs it: its tests share the
# binary's control plane and their own limits (the cluster-autoscaler scenarios two at a time,
# the crash runs five at a time). Its output goes to $CARGO_TARGET_DIR/test-logs/NAME.log and
# is printed if it fails. Every executable runs even after a failure; the exit status is 1 if
# any failed.
#
# Environment: HOMELAB_TEST_LANES (default 3) executables at once. HOMELAB_TEST_BUILD_FIRST names
# a build-binaries.sh profile to build beside the test build (`make test` passes `cluster`, what
# the suites that run alone need), and HOMELAB_TEST_IMAGE_FIRST=1 builds the operator's image
# there too (scripts/build-image.sh with IMAGE_PROFILE=dev: linked from the test build's crates,
# handed to the suites as HOMELAB_OPERATOR_IMAGE): on two cores the Go build and the cargo build
# fill each other's serial stretches, and the first suite starts when both are done.
# HOMELAB_TEST_CLIPPY=1 lints the workspace in the test build (below). HOMELAB_TEST_BUILD_BESIDE names
# a build-binaries.sh profile to build beside the suites, at nice 19 (`make test` passes
# `all`): the suites that run alone and many in the lanes wait on clocks, not on the CPU,
# so the Go programs that only some suites need are built in that idle time instead of before
# every suite. A suite that needs one first waits on that program's lock (or builds it); the
# runner waits for the build at the end and reports it like a suite. HOMELAB_TEST_LOAD=N runs
# the suites (and the build beside them) with N busy processes beside them (with-load.sh), to try
# a change under the load CI puts on it; the test build before them runs without.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
lanes=${HOMELAB_TEST_LANES:-3}
logs=${CARGO_TARGET_DIR:-$root/target}/test-logs

# Suites that run with nothing beside them, before the others: each asserts on timing that a
# loaded CPU stretches (a SIGKILLed operator's restart, a Lease handed over, apiserver and etcd
# restarted in place). Short, so running them alone costs little.
alone=(reliability_sigkill reliability_lease reliability_faults e2e_failover)
# The longest suites start first so that no lane is left with a long one at the end; the rest
# (new suites included) follow in name order. The real-machine suites come after three that
# need no real machine, so that on a cold cache the build beside the suites has made the
# kubelet and containerd by the time they start. arm64_operator builds the aarch64 half (D43)
# cold in its lane, so it starts among the first.
longest=(e2e_cluster_autoscaler controllers reliability_crash arm64_operator real_machines_faults real_machines_faults_autoscaler real_machines real_machines_drivers real_machines_suspend)

# The command line as given, for the run under load to start again with (the loop consumes it).
given=("$@")
names=()
args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --) shift; args=("$@"); break ;;
    *) names+=("$1"); shift ;;
  esac
done

cd "$root"
rm -rf "$logs"
mkdir -p "$logs"

# With HOMELAB_TEST_CLIPPY=1 (.ci/run) the test build is also the lint: the workspace's crates
# are compiled by clippy-driver, as `cargo clippy` checks them, and a warning fails the build.
# One build compiles and lints instead of a second, check-only build of every dependency. The
# image linked from the test build's crates (below) takes the same wrapper, so it shares them.
if [[ -n ${HOMELAB_TEST_CLIPPY:-} ]]; then
  RUSTC_WORKSPACE_WRAPPER=$(rustc --print sysroot)/bin/clippy-driver
  CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
  export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
fi

# The builds beside the test build (HOMELAB_TEST_BUILD_FIRST, HOMELAB_TEST_IMAGE_FIRST), each in
# a process group of its own, so that a failed test build stops them whole.
# before NAME WHAT COMMAND...: runs COMMAND beside the test build, its output in $logs/NAME.log.
declare -A before_pid=() before_start=()
before() {
  local name=$1 what=$2; shift 2
  printf 'run-tests: start  %s (%s) beside the test build\n' "$name" "$what"
  before_start[$name]=$(date +%s)
  setsid "$@" >"$logs/$name.log" 2>&1 &
  before_pid[$name]=$!
}
stop_before() {
  local pid
  for pid in "${before_pid[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
}
trap stop_before EXIT
if [[ -n ${HOMELAB_TEST_BUILD_FIRST:-} ]]; then
  before build-first "build-binaries.sh $HOMELAB_TEST_BUILD_FIRST" \
    "$root/tests/harness/build-binaries.sh" "$HOMELAB_TEST_BUILD_FIRST"
fi
if [[ -n ${HOMELAB_TEST_IMAGE_FIRST:-} ]]; then
  # The profile is the harness's TEST_IMAGE_PROFILE (tests/harness/src/real_lab.rs).
  export HOMELAB_OPERATOR_IMAGE=${CARGO_TARGET_DIR:-$root/target}/image/homelab-autoscaler-tests.tar
  # The machines here are amd64: the arm64 half is tests/install_image.rs's to build.
  before image-first "scripts/build-image.sh, linked from the test build" env IMAGE_PROFILE=dev PLATFORMS=linux/amd64 \
    "$root/scripts/build-image.sh" "$HOMELAB_OPERATOR_IMAGE"
fi

# Build everything first (compile errors stop here), then read the executables from cargo's
# artifact messages: kind, name, executable, the package directory (cargo's working directory
# for a test).
artifacts=$(cargo test --workspace --all-targets --locked --no-run --message-format=json-render-diagnostics |
  python3 -c '
import json, os, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    kind = m["target"]["kind"][0]
    # The operator binary is also built as a program for the tests to run; only its test
    # build holds tests. Benchmarks (harness = false) run once in test mode.
    if not m["profile"]["test"] and kind != "bench":
        continue
    print(kind, m["target"]["name"], m["executable"], os.path.dirname(m["manifest_path"]), sep="\t")
')

# Wait for the builds beside it; the Go build's log (each program's build time) is printed.
for name in "${!before_pid[@]}"; do
  status=0
  wait "${before_pid[$name]}" || status=$?
  took=$(($(date +%s) - ${before_start[$name]}))
  unset "before_pid[$name]"
  if [[ $status -ne 0 ]]; then
    cat "$logs/$name.log"
    printf 'run-tests: FAILED %s (exit %d, %ds)\n' "$name" "$status" "$took"
    exit 1
  fi
  [[ $name != build-first ]] || grep -v '^go: downloading' "$logs/$name.log" || true
  printf 'run-tests: ok     %s %ds\n' "$name" "$took"
done
trap - EXIT

# The build is done (a second one finds nothing to do): the suites run under the load asked for.
if [[ -n ${HOMELAB_TEST_LOAD:-} && -z ${HOMELAB_TEST_LOAD_STARTED:-} ]]; then
  HOMELAB_TEST_LOAD_STARTED=1 exec "$root/tests/harness/with-load.sh" "$HOMELAB_TEST_LOAD" "$root/tests/harness/run-tests.sh" "${given[@]}"
fi

declare -A exe_of=() dir_of=()
all=()
while IFS=$'\t' read -r kind name exe dir; do
  [[ -n $name ]] || continue
  [[ -z ${exe_of[$name]:-} ]] || { echo "run-tests: two test targets named $name" >&2; exit 1; }
  exe_of[$name]=$exe
  dir_of[$name]=$dir
  all+=("$name")
done <<<"$artifacts"

if [[ ${#names[@]} -eq 0 ]]; then
  names=("${all[@]}")
fi
for name in "${names[@]}"; do
  [[ -n ${exe_of[$name]:-} ]] || { echo "run-tests: no test target $name (have: ${all[*]})" >&2; exit 1; }
done

# The order: alone, then longest, then the rest by name; each only if asked for.
declare -A wanted=() placed=()
for name in "${names[@]}"; do wanted[$name]=1; done
first=()
for name in "${alone[@]}"; do [[ -n ${wanted[$name]:-} ]] && first+=("$name") && placed[$name]=1; done
queue=()
for name in "${longest[@]}"; do [[ -n ${wanted[$name]:-} ]] && queue+=("$name") && placed[$name]=1; done
while IFS= read -r name; do
  [[ -n $name && -z ${placed[$name]:-} ]] && queue+=("$name")
done < <(printf '%s\n' "${names[@]}" | sort)

failed=()
started=$(date +%s)
declare -A pid_name=() start_of=()

finish() {
  local pid=$1
  report "${pid_name[$pid]}" "$2"
  unset "pid_name[$pid]"
}

# report NAME STATUS: one line for a finished job (its log is $logs/NAME.log).
report() {
  local name=$1 status=$2
  local took=$(($(date +%s) - ${start_of[$name]}))
  if [[ $status -eq 0 ]]; then
    printf 'run-tests: ok     %-32s %4ds\n' "$name" "$took"
  else
    printf 'run-tests: FAILED %-32s %4ds (exit %d; %s)\n' "$name" "$took" "$status" "$logs/$name.log"
    failed+=("$name")
  fi
}

launch() {
  local name=$1
  start_of[$name]=$(date +%s)
  printf 'run-tests: start  %s\n' "$name"
  (cd "${dir_of[$name]}" && exec "${exe_of[$name]}" "${args[@]}") >"$logs/$name.log" 2>&1 &
  pid_name[$!]=$name
}

# Waits for one running executable to end.
reap() {
  local pid status=0
  wait -n -p pid "${!pid_name[@]}" || status=$?
  finish "$pid" "$status"
}

# At nice 19 a build takes only the CPU the suites leave idle, so it may run beside even the
# suites that run alone: those assert on clocks of seconds, and a suite's wake-up preempts it.
beside_pid=""
if [[ -n ${HOMELAB_TEST_BUILD_BESIDE:-} ]]; then
  start_of[build-beside]=$(date +%s)
  printf 'run-tests: start  build-binaries.sh %s beside the suites (nice 19)\n' "$HOMELAB_TEST_BUILD_BESIDE"
  nice -n 19 "$root/tests/harness/build-binaries.sh" "$HOMELAB_TEST_BUILD_BESIDE" >"$logs/build-beside.log" 2>&1 &
  beside_pid=$!
fi
for name in "${first[@]}"; do
  launch "$name"
  reap
done
for name in "${queue[@]}"; do
  while [[ ${#pid_name[@]} -ge $lanes ]]; do reap; done
  launch "$name"
done
while [[ ${#pid_name[@]} -gt 0 ]]; do reap; done
if [[ -n $beside_pid ]]; then
  status=0
  wait "$beside_pid" || status=$?
  report build-beside "$status"
fi

elapsed=$(($(date +%s) - started))
count=$((${#first[@]} + ${#queue[@]}))
for name in "${failed[@]}"; do
  printf '\n===== %s (%s) =====\n' "$name" "$logs/$name.log"
  cat "$logs/$name.log"
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "run-tests: ${#failed[@]} of $count test executables failed in ${elapsed}s: ${failed[*]}"
  exit 1
fi
echo "run-tests: $count test executables passed in ${elapsed}s ($lanes lanes)"
