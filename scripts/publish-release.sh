#!/usr/bin/env bash
# Pushes a release: the image `make image` wrote (an OCI image layout tarball holding the image
# index) and the chart, packaged by helm as an OCI artifact, to a registry. Builds no image:
# .github/workflows/release.yml runs `make image` first, so a release is the image the tests
# read back. helm and crane are the harness's (build-binaries.sh `release`), at the tests' pins.
#
#   scripts/publish-release.sh VERSION IMAGE_REPOSITORY CHART_REPOSITORY
#   e.g. scripts/publish-release.sh 0.3.0 ghcr.io/homecluster-dev/homelab-autoscaler ghcr.io/homecluster-dev/charts
#
# VERSION must be the crate's version and the chart's `version` and `appVersion` (the chart's
# default image tag).
# Credentials: crane and helm read the registry logins already made (`crane auth login`,
# `helm registry login`). Prints `image=REPO@DIGEST` and `chart=REPO/homelab-autoscaler@DIGEST`,
# and appends `image-digest=`, `chart-digest=`, `chart-name=` to $GITHUB_OUTPUT when set.
#
# Environment: CARGO_TARGET_DIR (where `make image` wrote the tarball), IMAGE_TAR (another one),
# PUBLISH_PLAIN_HTTP=1 (the registry speaks plain HTTP: a trial run against `crane registry serve`).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${1:?VERSION} image_repo=${2:?IMAGE_REPOSITORY} chart_repo=${3:?CHART_REPOSITORY}
tarball=${IMAGE_TAR:-${CARGO_TARGET_DIR:-$root/target}/image/homelab-autoscaler.tar}
chart=$root/charts/homelab-autoscaler
log() { printf '[publish] %s\n' "$*" >&2; }

for field in version appVersion; do
  got=$(sed -n "s/^$field: *\"\\{0,1\\}\\([^\"]*\\)\"\\{0,1\\}$/\\1/p" "$chart/Chart.yaml")
  [[ $got == "$version" ]] || { log "Chart.yaml's $field is $got, not $version"; exit 1; }
done
crate=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
[[ $crate == "$version" ]] || { log "Cargo.toml's version is $crate, not $version"; exit 1; }
[[ -f $tarball ]] || { log "no image at $tarball: run make image first"; exit 1; }

bin=$("$root/tests/harness/build-binaries.sh" release | tail -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The image: the layout's index.json names what `make image` built. One entry (the image index,
# or a single image) is pushed as itself; several are pushed as one index.
mkdir -p "$work/layout"
tar -xf "$tarball" -C "$work/layout"
entries=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["manifests"]))' "$work/layout/index.json")
index_flag=()
((entries == 1)) || index_flag=(--index)
plain=(); helm_plain=()
if [[ -n ${PUBLISH_PLAIN_HTTP:-} ]]; then plain=(--insecure); helm_plain=(--plain-http); fi
image_ref=$("$bin/crane" "${plain[@]}" push "${index_flag[@]}" "$work/layout" "$image_repo:$version")
image_digest=${image_ref##*@}
log "pushed $image_repo:$version ($image_digest)"

# The chart, as an OCI artifact: oci://CHART_REPOSITORY/homelab-autoscaler:VERSION.
"$bin/helm" package "$chart" --destination "$work" >&2
"$bin/helm" push "${helm_plain[@]}" "$work/homelab-autoscaler-$version.tgz" "oci://$chart_repo" 2>&1 | tee "$work/push.log" >&2
chart_digest=$(sed -n 's/^Digest: *\(sha256:[0-9a-f]*\).*/\1/p' "$work/push.log")
[[ -n $chart_digest ]] || { log "helm push printed no digest"; exit 1; }

echo "image=$image_repo@$image_digest"
echo "chart=$chart_repo/homelab-autoscaler@$chart_digest"
if [[ -n ${GITHUB_OUTPUT:-} ]]; then
  { echo "image-digest=$image_digest"; echo "chart-digest=$chart_digest"
    echo "chart-name=$chart_repo/homelab-autoscaler"; } >>"$GITHUB_OUTPUT"
fi
