#!/usr/bin/env bash
# `make demo`: build what is missing, then run the narrated demo (examples/demo.rs).
#   DRIVER=cluster-autoscaler|builtin|sleep|both (default both; sleep: real machines only)
#   KEEP=1 leaves the last cluster up
#   MACHINES=real plays the pools on real machines (needs root): it builds the machines'
#   programs (kubelet, containerd, runc, CNI plugins) and the operator's image as well.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
case ${MACHINES:-simulated} in
  simulated) tests/harness/build-binaries.sh autoscaler >/dev/null ;;
  real)
    if [[ $(id -u) != 0 ]]; then
      echo "make demo MACHINES=real needs root (network namespaces, cgroups, mounts); make demo runs without" >&2
      exit 1
    fi
    tests/harness/build-binaries.sh machines >/dev/null ;;
  *) echo "MACHINES=$MACHINES: use simulated or real" >&2; exit 2 ;;
esac
cargo build --locked --bins --examples -q
target_dir=${CARGO_TARGET_DIR:-target}
if [[ ${MACHINES:-simulated} == real ]]; then
  # The lab machine runs the power Jobs from the operator's image; no registry serves it.
  export HOMELAB_OPERATOR_IMAGE="$target_dir/image/homelab-autoscaler-machines.tar"
  PLATFORMS=linux/amd64 scripts/build-image.sh "$HOMELAB_OPERATOR_IMAGE" >/dev/null
fi
exec "$target_dir/debug/examples/demo" "$target_dir/debug/homelab-autoscaler"
