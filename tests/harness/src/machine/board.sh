# The power wiring of a real test machine: what a power cut, a shutdown, a suspend and the final
# teardown do to its processes, cgroups, mounts and network namespace. Run by bash from
# src/machine/ (both by the test and, when the test process is gone, by the machine's janitor),
# so one text says it.
#
#   signal SIGNAL CGROUP...          send SIGNAL to every process in the cgroups (and below)
#   wait-empty SECONDS CGROUP...     wait until no process is left in them; status 1 if some are
#   freeze CGROUP                    suspend: stop every process where it stands; status 1 if
#                                    the cgroup is not FROZEN within 5 s
#   thaw CGROUP                      resume: let them run on
#   cut CGROUP                       power loss: freeze, SIGKILL everything, thaw, wait
#   teardown CGROUP NETNS DIR        cut, then remove the cgroups, DIR's mounts, NETNS and DIR
#
# A CGROUP is a path below each hierarchy's root (/homelab-…/m1); the machine's processes are in
# the freezer hierarchy, as are its pods (the kubelet and runc join every v1 hierarchy).
set -u

# procs CGROUP...: the processes in the cgroups and their descendants (freezer hierarchy).
procs() {
  local cg
  for cg in "$@"; do
    [ -d "/sys/fs/cgroup/freezer$cg" ] || continue
    find "/sys/fs/cgroup/freezer$cg" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

signal() {
  local sig=$1; shift
  local pids; pids=$(procs "$@")
  [ -z "$pids" ] || kill "-$sig" $pids 2>/dev/null
  return 0
}

wait_empty() {
  local seconds=$1; shift
  local i
  for i in $(seq $((seconds * 10))); do
    [ -z "$(procs "$@")" ] && return 0
    sleep 0.1
  done
  [ -z "$(procs "$@")" ]
}

# v1's freezer freezes the descendants too; the cgroup reads FROZEN once all of them are.
freeze() {
  local state="/sys/fs/cgroup/freezer$1/freezer.state" i
  [ -e "$state" ] || { echo "board.sh: no $state" >&2; return 1; }
  echo FROZEN > "$state"
  for i in $(seq 50); do
    [ "$(cat "$state")" = FROZEN ] && return 0
    sleep 0.1
  done
  echo "board.sh: $state still reads $(cat "$state") after 5 s" >&2
  return 1
}

thaw() {
  local state="/sys/fs/cgroup/freezer$1/freezer.state"
  [ -e "$state" ] && echo THAWED > "$state"
  return 0
}

# A frozen cgroup forks no new process between the listing and the SIGKILL (a shim starting
# runc); the signals are delivered on thaw. A suspended machine is already frozen.
cut() {
  freeze "$1" 2>/dev/null
  signal KILL "$1"
  thaw "$1"
  wait_empty 10 "$1" || { signal KILL "$1"; wait_empty 10 "$1"; }
}

teardown() {
  local cg=$1 netns=$2 dir=$3 i h mounts
  cut "$cg"
  # Children before parents; a cgroup whose last process has just died may take a moment to let go.
  for i in $(seq 50); do
    for h in /sys/fs/cgroup/*/; do
      [ -d "$h${cg#/}" ] && find "$h${cg#/}" -depth -type d -exec rmdir {} + 2>/dev/null
    done
    ls -d /sys/fs/cgroup/*"$cg" >/dev/null 2>&1 || break
    sleep 0.1
  done
  # The kubelet's volumes, containers' root filesystems, pod network namespaces: deepest first.
  mounts=$(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r)
  for h in $mounts; do umount -l "$h" 2>/dev/null; done
  # The kubelet links every container's log from the host's /var/log/containers (not
  # configurable), into the machine's directory.
  find /var/log/containers -maxdepth 1 -lname "$dir/*" -delete 2>/dev/null
  ip netns delete "$netns" 2>/dev/null
  if [ -n "${HOMELAB_TEST_KEEP:-}" ]; then
    echo "[machine] kept $dir (HOMELAB_TEST_KEEP is set)" >&2
  else
    rm -rf --one-file-system -- "$dir"
  fi
  return 0
}

command=$1; shift
case $command in
  signal) signal "$@" ;;
  wait-empty) wait_empty "$@" ;;
  freeze) freeze "$@" ;;
  thaw) thaw "$@" ;;
  cut) cut "$@" ;;
  teardown) teardown "$@" ;;
  *) echo "board.sh: unknown command $command" >&2; exit 2 ;;
esac
