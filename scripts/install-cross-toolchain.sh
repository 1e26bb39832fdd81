#!/usr/bin/env bash
# Installs what building and running the operator for linux/arm64 needs, from Debian's packages
# (docs/decisions.md D43 says why these): Debian's Rust compiler with its aarch64 standard
# library (`rustc-web`, `libstd-rust-web-dev:arm64`, after `dpkg --add-architecture arm64`), the
# aarch64 linker and C library (`gcc-aarch64-linux-gnu`, `libc6-dev-arm64-cross`; ring compiles C)
# and qemu-user, which runs the aarch64 binaries here. Idempotent: quick when all is there.
# Packages land in the system, never in the repository.
set -euo pipefail

missing=()
[[ -x /usr/bin/rustc ]] || missing+=(rustc-web)
[[ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu/lib ]] || missing+=(libstd-rust-web-dev:arm64)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
[[ -e /usr/aarch64-linux-gnu/lib/libc.a ]] || missing+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null 2>&1 || missing+=(qemu-user)
((${#missing[@]})) || exit 0

echo "install-cross-toolchain: installing Debian packages: ${missing[*]}" >&2
if [[ $(id -u) -ne 0 ]]; then sudo=sudo; else sudo=; fi
export DEBIAN_FRONTEND=noninteractive
# Other scripts of the project may hold dpkg's lock for a while (install-power-peers.sh).
apt=(apt-get -o DPkg::Lock::Timeout=600 -qq)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $sudo dpkg --add-architecture arm64
fi
$sudo "${apt[@]}" update
$sudo "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
