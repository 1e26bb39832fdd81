#!/usr/bin/env bash
# Builds the operator's OCI image index without a container engine: for linux/amd64 and
# linux/arm64 a static binary (x86_64- and aarch64-unknown-linux-gnu with crt-static; the musl
# target is not needed), one layer holding it, packed by scripts/oci-archive.sh into one OCI image
# layout tarball holding the index (`oci-archive`: podman load, skopeo, ctr import, docker load on
# Docker 25+); a node pulls its own platform. Each image is the Dockerfile's: scratch, non-root,
# entrypoint the binary, OCI labels. The arm64 binary comes from scripts/build-arm64.sh (Debian's
# rustc and the aarch64 linker; docs/decisions.md D43). A static glibc binary cannot load NSS
# modules, so getaddrinfo resolves no names in it: the power drivers ask the nameservers in
# /etc/resolv.conf themselves (src/power/resolve.rs; the kubelet writes that file into every
# pod), and the operator reaches the API server by the IP address in KUBERNETES_SERVICE_HOST.
#
#   scripts/build-image.sh [OUT.tar]     (default: $CARGO_TARGET_DIR/image/homelab-autoscaler.tar)
#
# Environment: IMAGE (default ghcr.io/homecluster-dev/homelab-autoscaler), TAG (default the
# crate's version), IMAGE_PROFILE (the cargo profile of the binary, default `release`),
# CARGO_TARGET_DIR, HOMELAB_TEST_CACHE (where crane is built), PLATFORMS (default
# "linux/amd64 linux/arm64"; one platform makes a single image instead of an index).
#
# IMAGE_PROFILE=dev is the tests' image: the binary is linked statically from the crates the test
# build (`cargo test`, the `dev` profile, in CARGO_TARGET_DIR as its build dir) has compiled, so
# it costs one link instead of a second build of every dependency. Only the final link is
# static: std decides at that link whether libc is linked statically (crt-static), so crates
# compiled for the dynamic test build serve. The binary is uplifted into a target dir of its own,
# so the test build's own `homelab-autoscaler` stays the dynamic one the suites run. Its arm64
# half is the dev build the aarch64 tests run (scripts/build-arm64.sh), without debug info.
set -euo pipefail
shopt -s inherit_errexit # a failed build inside $(amd64_binary) stops the script

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${1:-$target_dir/image/homelab-autoscaler.tar}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
image=${IMAGE:-ghcr.io/homecluster-dev/homelab-autoscaler}
tag=${TAG:-$version}
profile=${IMAGE_PROFILE:-release}
platforms=${PLATFORMS:-linux/amd64 linux/arm64}
log() { printf '[image] %s\n' "$*" >&2; }

# amd64_binary: prints the path of the static linux/amd64 binary, built with the toolchain the
# tests compile with (rustup's).
amd64_binary() {
  local triple=x86_64-unknown-linux-gnu
  if [[ $profile == dev ]]; then
    log "linking the static amd64 binary from the test build's crates (dev, crt-static at the link)"
    CARGO_BUILD_BUILD_DIR=$target_dir CARGO_TARGET_DIR=$target_dir/image-link \
      cargo rustc --profile dev --locked --bin homelab-autoscaler --manifest-path "$root/Cargo.toml" \
      -- -C target-feature=+crt-static -C strip=debuginfo >&2
    echo "$target_dir/image-link/debug/homelab-autoscaler"
  else
    log "building the static amd64 binary ($profile, $triple, crt-static)"
    RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
      cargo build --profile "$profile" --locked --target "$triple" --bin homelab-autoscaler \
      --manifest-path "$root/Cargo.toml" >&2
    echo "$target_dir/$triple/$profile/homelab-autoscaler"
  fi
}

bin_dir=$("$root/tests/harness/build-binaries.sh" image | tail -n 1)
crane=$bin_dir/crane

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One layer per platform, reproducible: fixed owner, mode and time.
layers=()
for platform in $platforms; do
  arch=${platform#linux/}
  case $platform in
    linux/amd64) binary=$(amd64_binary) ;;
    linux/arm64) binary=$("$root/scripts/build-arm64.sh" build "$profile") ;;
    *) log "no build for platform $platform (linux/amd64, linux/arm64)"; exit 2 ;;
  esac
  rootfs=$work/rootfs-$arch
  mkdir -p "$rootfs/tmp"
  install -m 0755 "$binary" "$rootfs/homelab-autoscaler"
  # The dev profile keeps line tables in the workspace's crates; an image needs none.
  [[ $arch == arm64 ]] && aarch64-linux-gnu-strip --strip-debug "$rootfs/homelab-autoscaler"
  chmod 1777 "$rootfs/tmp"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$rootfs" \
    -cf "$work/layer-$arch.tar" homelab-autoscaler tmp
  layers+=("$platform=$work/layer-$arch.tar")
done
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
# Written beside OUT and renamed onto it: a reader (ctr import in another test binary that asked
# for the same image) sees the old tarball or the new one, never one half written.
mkdir -p "$(dirname "$out")"
partial=$(mktemp "$(dirname "$out")/.$(basename "$out").XXXXXX")
trap 'rm -rf "$work" "$partial"' EXIT
"$root/scripts/oci-archive.sh" "$crane" "$(IFS=,; echo "${layers[*]}")" "$partial" "$image:$tag" \
  --entrypoint /homelab-autoscaler --cmd run \
  --user 65532:65532 --workdir / \
  -l org.opencontainers.image.title=homelab-autoscaler \
  -l "org.opencontainers.image.version=$tag" \
  -l "org.opencontainers.image.revision=$revision" \
  -l org.opencontainers.image.source=https://github.com/homecluster-dev/homelab-autoscaler \
  -l org.opencontainers.image.licenses=Apache-2.0 \
  -l "org.opencontainers.image.ref.name=$image:$tag"
chmod 0644 "$partial"
mv -f "$partial" "$out"
log "wrote $out ($image:$tag, $platforms, $(du -h "$out" | cut -f1))"
