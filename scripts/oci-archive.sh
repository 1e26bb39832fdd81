#!/usr/bin/env bash
# Packs one layer per platform into an OCI image layout tarball named NAME, without a container
# engine: crane builds each platform's image in an in-memory registry on loopback (for the length
# of this script) and, for several platforms, the image index that lists them; then writes it out
# as a layout whose index.json names the image (or the index), as `ctr images import`, skopeo and
# podman read it (crane's own index.json names nothing). MUTATE_ARGS go to `crane mutate` for
# every platform's image (entrypoint, user, labels).
#
#   scripts/oci-archive.sh CRANE LAYERS OUT.tar NAME [MUTATE_ARGS...]
#
# LAYERS is LAYER.tar (a linux/amd64 image), or PLATFORM=LAYER.tar[,PLATFORM=LAYER.tar...]
# (linux/amd64=amd64.tar,linux/arm64=arm64.tar: an image index, one image per platform).
set -euo pipefail

crane=$1 layers=$2 out=$3 name=$4
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
platforms=() files=()
IFS=, read -ra specs <<<"$layers"
for spec in "${specs[@]}"; do
  if [[ $spec == *=* ]]; then platforms+=("${spec%%=*}") files+=("${spec#*=}")
  else platforms+=(linux/amd64) files+=("$spec"); fi
done
refs=()
for i in "${!platforms[@]}"; do
  ref=127.0.0.1:$port/image:${platforms[$i]//\//-}
  "$crane" append --oci-empty-base -f "${files[$i]}" -t "$ref" >/dev/null
  "$crane" mutate "$ref" -t "$ref" --set-platform "${platforms[$i]}" "$@" >/dev/null
  refs+=("$ref")
done
if ((${#refs[@]} == 1)); then
  ref=${refs[0]} media_type=application/vnd.oci.image.manifest.v1+json
else
  # The index takes each image's platform from its config.
  ref=127.0.0.1:$port/image:index media_type=application/vnd.oci.image.index.v1+json
  manifests=()
  for each in "${refs[@]}"; do manifests+=(-m "$each"); done
  "$crane" index append "${manifests[@]}" -t "$ref" >/dev/null
fi
"$crane" pull --format=oci "$ref" "$work/oci"
digest=$("$crane" digest "$ref")
size=$("$crane" manifest "$ref" | wc -c)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"%s","size":%d,"digest":"%s","annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}\n' \
  "$media_type" "$size" "$digest" "$name" "$name" > "$work/oci/index.json"
mkdir -p "$(dirname "$out")"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/oci" -cf "$out" .
