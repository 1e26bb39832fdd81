#!/usr/bin/env bash
# `make demo`: build what is missing, then run the narrated demo (examples/demo.rs).
#   DRIVER=cluster-autoscaler|builtin|both (default both)   KEEP=1 leaves the last cluster up
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
tests/harness/build-binaries.sh autoscaler >/dev/null
cargo build --locked --bins --examples -q
target_dir=${CARGO_TARGET_DIR:-target}
exec "$target_dir/debug/examples/demo" "$target_dir/debug/homelab-autoscaler"
