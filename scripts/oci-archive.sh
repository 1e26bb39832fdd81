#!/usr/bin/env bash
# Packs one layer into an OCI image layout tarball named NAME, without a container engine:
# crane builds the image in an in-memory registry on loopback (for the length of this script),
# then writes it out as a layout whose index names the image, as `ctr images import`, skopeo and
# podman read it (crane's own index names nothing). MUTATE_ARGS go to `crane mutate` (entrypoint,
# user, labels); the platform is always linux/amd64.
#
#   scripts/oci-archive.sh CRANE LAYER.tar OUT.tar NAME [MUTATE_ARGS...]
set -euo pipefail

crane=$1 layer=$2 out=$3 name=$4
shift 4
log() { printf '[oci-archive] %s\n' "$*" >&2; }

work=$(mktemp -d)
registry_pid=""
cleanup() { [[ -n $registry_pid ]] && kill "$registry_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

"$crane" registry serve --address 127.0.0.1:0 >"$work/registry.log" 2>&1 &
registry_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$work/registry.log")
  [[ -n $port ]] && break
  sleep 0.1
done
[[ -n $port ]] || { log "crane's registry did not start: $(cat "$work/registry.log")"; exit 1; }
ref=127.0.0.1:$port/image:build
"$crane" append --oci-empty-base -f "$layer" -t "$ref" >/dev/null
"$crane" mutate "$ref" -t "$ref" --set-platform linux/amd64 "$@" >/dev/null
"$crane" pull --format=oci "$ref" "$work/oci"
digest=$("$crane" digest "$ref")
size=$("$crane" manifest "$ref" | wc -c)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","size":%d,"digest":"%s","annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}\n' \
  "$size" "$digest" "$name" "$name" > "$work/oci/index.json"
mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/oci" -cf "$out" .
