#!/usr/bin/env bash
# `make demo`: build what is missing, then run the narrated demo (examples/demo.rs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
tests/harness/build-binaries.sh cluster >/dev/null
cargo build --locked --bins --examples -q
target_dir=${CARGO_TARGET_DIR:-target}
exec "$target_dir/debug/examples/demo" "$target_dir/debug/homelab-autoscaler"
