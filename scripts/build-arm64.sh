#!/usr/bin/env bash
# The operator for linux/arm64 (aarch64-unknown-linux-gnu), linked statically (crt-static) like the
# amd64 binary. Compiled by Debian's rustc with its aarch64 standard library and linked by the
# aarch64 gcc (scripts/install-cross-toolchain.sh installs them; docs/decisions.md D43 says why):
# rustup serves no aarch64 standard library on the machines this is built on. Another compiler's
# artifacts share nothing with the test build's, so they live in a target dir of their own,
# `$CARGO_TARGET_DIR-aarch64`. qemu-user runs what this builds.
#
#   scripts/build-arm64.sh build PROFILE    builds the binary (cargo profile PROFILE), prints its path
#   scripts/build-arm64.sh test [ARGS...]   the library's unit and table tests, run under qemu-aarch64
#                                           (`cargo test --lib ARGS`, qemu-aarch64 as cargo's runner)
#
# The dev binary and the tests share every dependency's build.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
triple=aarch64-unknown-linux-gnu
target_dir=${CARGO_TARGET_DIR:-$root/target}-aarch64
log() { printf '[arm64] %s\n' "$*" >&2; }

"$root/scripts/install-cross-toolchain.sh"

# Nothing of the host build's compiler settings applies here: clippy-driver (the test build's
# lint wrapper) is rustup's compiler, and global RUSTFLAGS would reach the host's build scripts.
unset RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS RUSTFLAGS CARGO_ENCODED_RUSTFLAGS \
  CARGO_BUILD_RUSTFLAGS CARGO_BUILD_BUILD_DIR CARGO_BUILD_TARGET
export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc CARGO_TARGET_DIR=$target_dir
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C target-feature=+crt-static"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar

case ${1:-} in
  build)
    profile=${2:?usage: build-arm64.sh build PROFILE}
    log "building the static binary ($profile, $triple, $($RUSTC --version))"
    cargo build --profile "$profile" --locked --target "$triple" --bin homelab-autoscaler \
      --manifest-path "$root/Cargo.toml" >&2
    dir=$profile
    [[ $profile == dev ]] && dir=debug
    echo "$target_dir/$triple/$dir/homelab-autoscaler"
    ;;
  test)
    shift
    log "the library's tests for $triple under $(qemu-aarch64 --version | head -n 1)"
    cargo test --locked --target "$triple" --lib --manifest-path "$root/Cargo.toml" "$@"
    ;;
  *)
    echo "usage: scripts/build-arm64.sh build PROFILE | test [ARGS...]" >&2
    exit 2
    ;;
esac
