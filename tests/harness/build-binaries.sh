#!/usr/bin/env bash
# Builds the upstream programs the test suite runs against, from the pinned Go wrapper
# modules beside this script, into a cache outside the repository. Idempotent: a binary is
# rebuilt only when its wrapper's go.mod/go.sum change. Prints the binary directory last.
#
#   build-binaries.sh [integration|cluster|autoscaler|storage|e2e|machines|all|lint|release|image]
#                                                                        (default: cluster)
#
# Up to `e2e` each profile is the one before it plus a few programs. `machines` is `autoscaler`
# plus the programs of the harness's real machines (kubelet, containerd, runc, CNI plugins, our
# pause), and no e2e program: a real-machine suite does not wait on Prometheus. `all` is both
# (what `make test` builds). `lint` is actionlint alone (for `make lint`), `release` helm and
# crane alone (for .github/workflows/release.yml), `image` crane alone (scripts/build-image.sh);
# none of those three builds a control plane.
#
# Environment:
#   HOMELAB_TEST_ASSETS  a directory of prebuilt binaries (as envtest's KUBEBUILDER_ASSETS);
#                        any program found there is used as is and not built.
#   HOMELAB_TEST_CACHE   where built binaries live (default: ~/.cache/homelab-autoscaler).
#   HOMELAB_CA_SOURCE    cluster-autoscaler's source (a module directory or a .tar.gz of it);
#                        default: ../shared/upstream/cluster-autoscaler/, else a git clone.
#   HOMELAB_CERT_MANAGER_SOURCE  cert-manager's cmd source tarball (controller/, cainjector/,
#                        crds/); default: ../shared/upstream/cert-manager/, else a git clone.
#   HOMELAB_KUBE_VERSION another Kubernetes release for the control plane, the kubelet and
#                        kubectl (`make test KUBE_VERSION=1.34.4`): built from wrappers generated
#                        from go/k8s and go/kubelet into $HOMELAB_TEST_CACHE/kube-vX.Y.Z/, never
#                        over the pinned ones; the directory printed is then a view of bin/ with
#                        that release's programs in place of the pinned ones.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${HOMELAB_TEST_CACHE:-$HOME/.cache/homelab-autoscaler}
bin="$cache/bin"
mkdir -p "$bin"
# No DWARF at compile time: the link strips it anyway (-s -w), so generating it is compile time
# spent for nothing.
go_flags="-mod=mod -gcflags=all=-dwarf=false"
export CGO_ENABLED=0 GOFLAGS="$go_flags" GOTOOLCHAIN=local

# The release the wrappers go/k8s and go/kubelet pin; HOMELAB_KUBE_VERSION picks another.
kube_pin=v1.37.2
kube_version=${HOMELAB_KUBE_VERSION:-$kube_pin}
kube_version=v${kube_version#v}
[[ $kube_version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || { echo "HOMELAB_KUBE_VERSION=$kube_version is not 1.MINOR.PATCH" >&2; exit 2; }
kube_minor=$(cut -d. -f2 <<<"$kube_version")
kube_ld=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=1 -X $p.gitMinor=$kube_minor"
  kube_ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
helm_ld="-X helm.sh/helm/v3/internal/version.version=v3.21.4"
for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  helm_ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=37"
done

log() { printf '[build-binaries] %s\n' "$*" >&2; }

# wrapper_key DIR [LDFLAGS]: a hash of what pins the build, so a changed pin rebuilds: the
# wrapper's go.mod and go.sum, and the version stamps (-X) of LDFLAGS (helm's Kubernetes minor).
# A wrapper whose go.sum is not written yet (GOFLAGS=-mod=mod writes it) hashes its go.mod alone.
# GO_DIR (default: go/ beside this script) holds the wrapper, BIN_DIR (default: $bin) the binaries.
wrapper_key() {
  local dir=${GO_DIR:-$here/go}/$1
  { cat "$dir/go.mod"; cat "$dir/go.sum" 2>/dev/null || true
    if [[ ${2:-} == *-X* ]]; then echo "$2"; fi; } | sha256sum | cut -c1-16
}

# key_file NAME: where the key of binary NAME is kept (NAME may be in a subdirectory: cni/bridge).
key_file() { echo "${BIN_DIR:-$bin}/$(dirname "$1")/.$(basename "$1").key"; }

# build WRAPPER "LDFLAGS" "TAGS" NAME=PACKAGE...
build() {
  local wrapper=$1 ldflags=$2 tags=$3; shift 3
  local key missing=() pkgs=() names=() dest=${BIN_DIR:-$bin}
  key=$(wrapper_key "$wrapper" "$ldflags")
  for pair in "$@"; do
    local name=${pair%%=*} pkg=${pair#*=}
    if [[ -n "${HOMELAB_TEST_ASSETS:-}" && -x "$HOMELAB_TEST_ASSETS/$name" ]]; then
      ln -sf "$HOMELAB_TEST_ASSETS/$name" "$dest/$name"; echo "prebuilt" > "$(key_file "$name")"
      log "$name: prebuilt from HOMELAB_TEST_ASSETS"; continue
    fi
    if [[ -x "$dest/$name" && "$(cat "$(key_file "$name")" 2>/dev/null)" == "$key" ]]; then
      log "$name: cached"; continue
    fi
    missing+=("$name"); pkgs+=("$pkg"); names+=("$name")
  done
  ((${#missing[@]})) || return 0
  log "building ${missing[*]} from ${GO_DIR:-go}/$wrapper (this is slow the first time; Go's caches make it fast after)"
  local out start; out=$(mktemp -d "$cache/build.XXXXXX"); start=$(date +%s)
  (cd "${GO_DIR:-$here/go}/$wrapper" && go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags -s -w" -o "$out/" "${pkgs[@]}")
  local i
  for i in "${!names[@]}"; do
    # go build names a binary after the package path's last element, skipping a /vN suffix.
    local elem; elem=$(basename "${pkgs[$i]}")
    [[ $elem =~ ^v[0-9]+$ ]] && elem=$(basename "$(dirname "${pkgs[$i]}")")
    local built="$out/$elem"
    mv -f "$built" "$dest/${names[$i]}"
    echo "$key" > "$(key_file "${names[$i]}")"
  done
  rm -rf "$out"
  log "built ${missing[*]} in $(( $(date +%s) - start ))s"
}

# cluster-autoscaler is not served by the Go module proxy, so it is built from source (its
# dependencies do come from the proxy). The source is, in order: $HOMELAB_CA_SOURCE (a
# directory holding the module, or a .tar.gz of it), the trimmed tarball in
# ../shared/upstream/cluster-autoscaler/ beside the repository, or a shallow clone of the
# release tag. The binary is keyed by the source's hash, so a new source rebuilds it.
ca_tag=cluster-autoscaler-1.36.1
ca_shared_dir=$(cd "$here/../.." && pwd)/../shared/upstream/cluster-autoscaler
build_cluster_autoscaler() {
  local name=cluster-autoscaler
  if [[ -n "${HOMELAB_TEST_ASSETS:-}" && -x "$HOMELAB_TEST_ASSETS/$name" ]]; then
    ln -sf "$HOMELAB_TEST_ASSETS/$name" "$bin/$name"; echo "prebuilt" > "$bin/.$name.key"
    log "$name: prebuilt from HOMELAB_TEST_ASSETS"; return 0
  fi
  local source=${HOMELAB_CA_SOURCE:-} tarball="" key
  if [[ -z $source ]]; then
    tarball=$(ls "$ca_shared_dir"/cluster-autoscaler-*-externalgrpc-src.tar.gz 2>/dev/null | head -n 1 || true)
    source=$tarball
  elif [[ -f $source ]]; then
    tarball=$source
  fi
  if [[ -n $tarball ]]; then
    key=$(sha256sum "$tarball" | cut -c1-16)
  elif [[ -n $source ]]; then
    [[ -f $source/go.mod ]] || { log "HOMELAB_CA_SOURCE=$source holds no go.mod"; return 1; }
    key=$(cat "$source/go.mod" "$source/go.sum" | sha256sum | cut -c1-16)
  else
    key=$ca_tag
  fi
  if [[ -x "$bin/$name" && "$(cat "$bin/.$name.key" 2>/dev/null)" == "$key" ]]; then
    log "$name: cached"; return 0
  fi
  local work start; work=$(mktemp -d "$cache/build.XXXXXX"); start=$(date +%s)
  local module
  if [[ -n $tarball ]]; then
    log "building $name from $tarball"
    tar -xzf "$tarball" -C "$work"
    module=$work/cluster-autoscaler
  elif [[ -n $source ]]; then
    log "building $name from $source"
    module=$source
  else
    log "building $name from a clone of $ca_tag (no source in HOMELAB_CA_SOURCE or $ca_shared_dir)"
    git clone -q --depth 1 --branch "$ca_tag" https://github.com/kubernetes/autoscaler "$work/autoscaler"
    module=$work/autoscaler/cluster-autoscaler
  fi
  [[ -f $module/go.mod ]] || { log "no cluster-autoscaler module found in $source"; rm -rf "$work"; return 1; }
  mkdir -p "$work/out"
  (cd "$module" && GOFLAGS="$go_flags -buildvcs=false" go build -trimpath -tags externalgrpc \
    -ldflags '-s -w' -o "$work/out/$name" .)
  mv -f "$work/out/$name" "$bin/$name"
  echo "$key" > "$bin/.$name.key"
  rm -rf "$work"
  log "built $name in $(( $(date +%s) - start ))s"
}

# cert-manager's controller and cainjector: their `cmd/` modules are not served by the Go
# module proxy (the root module is), so they come from a source tarball: $HOMELAB_CERT_MANAGER_SOURCE,
# else ../shared/upstream/cert-manager/ beside the repository, else a shallow clone of the tag
# (whose cmd modules point at the root module by a relative replace, which then holds). The
# CRDs land in $bin/cert-manager-crds/. Keyed by the source's hash.
cm_tag=v1.21.1
cm_shared_dir=$(cd "$here/../.." && pwd)/../shared/upstream/cert-manager
build_cert_manager() {
  local names=(cert-manager-controller cert-manager-cainjector) name
  local source=${HOMELAB_CERT_MANAGER_SOURCE:-} key
  [[ -n $source ]] || source=$(ls "$cm_shared_dir"/cert-manager-*-cmd-src.tar.gz 2>/dev/null | head -n 1 || true)
  if [[ -n $source ]]; then key=$(sha256sum "$source" | cut -c1-16); else key=$cm_tag; fi
  local fresh=1
  for name in "${names[@]}"; do
    if [[ -n "${HOMELAB_TEST_ASSETS:-}" && -x "$HOMELAB_TEST_ASSETS/$name" ]]; then
      ln -sf "$HOMELAB_TEST_ASSETS/$name" "$bin/$name"; echo "$key" > "$bin/.$name.key"
    fi
    [[ -x "$bin/$name" && "$(cat "$bin/.$name.key" 2>/dev/null)" == "$key" ]] || fresh=0
  done
  if ((fresh)) && [[ -f "$bin/cert-manager-crds/.key" && "$(cat "$bin/cert-manager-crds/.key")" == "$key" ]]; then
    log "cert-manager: cached"; return 0
  fi
  local work start root; work=$(mktemp -d "$cache/build.XXXXXX"); start=$(date +%s)
  if [[ -n $source ]]; then
    log "building cert-manager from $source"
    tar -xzf "$source" -C "$work"; root=$work
  else
    log "building cert-manager from a clone of $cm_tag (no source in HOMELAB_CERT_MANAGER_SOURCE or $cm_shared_dir)"
    git clone -q --depth 1 --branch "$cm_tag" https://github.com/cert-manager/cert-manager "$work/cm"
    root=$work/cm/cmd; mkdir -p "$root/crds"; cp "$work"/cm/deploy/crds/*.yaml "$root/crds/"
  fi
  local v="-X github.com/cert-manager/cert-manager/pkg/util.AppVersion=$cm_tag"
  for name in "${names[@]}"; do
    [[ "$(cat "$bin/.$name.key" 2>/dev/null)" == "$key" && -x "$bin/$name" ]] && continue
    (cd "$root/${name#cert-manager-}" && GOFLAGS="$go_flags -buildvcs=false" go build -trimpath \
      -ldflags "-s -w $v" -o "$work/$name" .)
    mv -f "$work/$name" "$bin/$name"; echo "$key" > "$bin/.$name.key"
  done
  rm -rf "$bin/cert-manager-crds"; mkdir -p "$bin/cert-manager-crds"
  cp "$root"/crds/*.yaml "$bin/cert-manager-crds/"; echo "$key" > "$bin/cert-manager-crds/.key"
  rm -rf "$work"
  log "built cert-manager in $(( $(date +%s) - start ))s"
}

# The real machines' only image, localhost/homelab/pause:1: our pause program as entrypoint, one
# layer, packed by scripts/oci-archive.sh into an OCI archive that `ctr images import` names
# from its index. No registry serves the tests, so the machines' containerd is given it (sandbox
# image and test workload alike).
# Keyed by the pause binary and crane.
build_pause_image() {
  local out="$bin/pause-image.tar" name=localhost/homelab/pause:1 key
  key=$(cat "$(key_file pause)" "$(key_file crane)" | sha256sum | cut -c1-16)
  if [[ -f $out && "$(cat "$(key_file pause-image.tar)" 2>/dev/null)" == "$key" ]]; then
    log "pause-image.tar: cached"; return 0
  fi
  local work; work=$(mktemp -d "$cache/build.XXXXXX")
  mkdir -p "$work/rootfs"
  install -m 0755 "$bin/pause" "$work/rootfs/pause"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" pause
  "$here/../../scripts/oci-archive.sh" "$bin/crane" "$work/layer.tar" "$out" "$name" --entrypoint /pause
  echo "$key" > "$(key_file pause-image.tar)"
  rm -rf "$work"
  log "built pause-image.tar ($name)"
}

want=${1:-cluster}
case "$want" in
  integration|cluster|autoscaler|storage|e2e|machines|all|lint|release|image) ;;
  *) echo "usage: $0 [integration|cluster|autoscaler|storage|e2e|machines|all|lint|release|image]" >&2; exit 2 ;;
esac

# Each program is built under a lock of its own, so two runs on one cache (the test runner's
# build beside the suites and a test binary that needs a program now, or a developer and a test
# run) never build the same program at once, while different programs build side by side. A run
# that waited finds the program cached and goes on. The holder writes its pid beside the lock; a
# waiter raises the holder's build to its own priority (as a mutex with priority inheritance
# does), so a suite never waits on a nice-19 build starved by the other suites. Raising a
# priority needs root; without it the waiter just waits.
locked() {
  local lock=$cache/locks/$1; shift
  mkdir -p "$cache/locks"
  (
    exec 9>"$lock"
    if ! flock -n 9; then
      log "waiting for another run to finish building ${lock##*/}"
      inherit_priority "$(cat "$lock.pid" 2>/dev/null || true)"
      flock 9
    fi
    echo "$BASHPID" >"$lock.pid"
    "$@"
  )
}

# inherit_priority PID: renices PID and every process below it to this process's niceness, if
# theirs is lower; processes they start later inherit it.
inherit_priority() {
  local holder=$1 mine theirs pids=() queue=("$1") pid
  [[ $holder =~ ^[0-9]+$ ]] || return 0
  mine=$(nice)
  theirs=$(ps -o ni= -p "$holder" 2>/dev/null | tr -d ' ' || true)
  [[ $theirs =~ ^-?[0-9]+$ ]] && ((theirs > mine)) || return 0
  while ((${#queue[@]})); do
    pid=${queue[0]}; queue=("${queue[@]:1}")
    pids+=("$pid")
    while read -r child; do [[ -n $child ]] && queue+=("$child"); done < <(pgrep -P "$pid" || true)
  done
  if renice -n "$mine" -p "${pids[@]}" >/dev/null 2>&1; then
    log "raised the build holding the lock (pid $holder, nice $theirs) to nice $mine"
  fi
}

# The profiles that need no control plane: the workflow linter of `make lint` (under its own
# lock like every program here, so a `make lint` beside `make test`, as .ci/run runs them, never
# builds it twice or into a half-written file), and the release workflow's publishing tools.
if [[ $want == lint ]]; then
  locked actionlint build actionlint "" "" actionlint=github.com/rhysd/actionlint/cmd/actionlint
  echo "$bin"; exit 0
fi
if [[ $want == release ]]; then
  locked helm build helm "$helm_ld" "" helm=helm.sh/helm/v3/cmd/helm
  locked crane build crane "" "" crane=github.com/google/go-containerregistry/cmd/crane
  echo "$bin"; exit 0
fi
if [[ $want == image ]]; then
  locked crane build crane "" "" crane=github.com/google/go-containerregistry/cmd/crane
  echo "$bin"; exit 0
fi

# Another Kubernetes release (HOMELAB_KUBE_VERSION): go/k8s and go/kubelet are rewritten for it
# into $cache/kube-$kube_version/go/ (their headers and replace blocks with its version; `go mod
# tidy` then takes every other requirement from that release's own go.mod), and its programs are
# built into $cache/kube-$kube_version/bin/, keyed like the pinned ones. The pinned binaries in
# $bin are never touched, so a later run without HOMELAB_KUBE_VERSION finds them as they were.
kube_go=$here/go kube_bin=$bin
kube_programs=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet)
if [[ $kube_version != "$kube_pin" ]]; then
  kube_go=$cache/kube-$kube_version/go kube_bin=$cache/kube-$kube_version/bin
  mkdir -p "$kube_bin"
fi
# kube_wrapper NAME: writes the wrapper go/NAME for $kube_version into $kube_go (once per pinned
# go.mod: the pin's hash is kept beside it).
kube_wrapper() {
  local name=$1 dir=$kube_go/$1 pin_key staging=${kube_version/#v1./v0.}
  pin_key=$(sha256sum "$here/go/$name/go.mod" | cut -c1-16)
  [[ -f $dir/go.sum && "$(cat "$dir/.pin" 2>/dev/null)" == "$pin_key" ]] && return 0
  log "writing go/$name for Kubernetes $kube_version (go mod tidy)"
  rm -rf "$dir"; mkdir -p "$dir"
  # The pinned go.mod without its require blocks, every version in its replace block rewritten.
  awk -v k="$kube_version" -v s="$staging" '
    /^require[ (]/ { skip = ($0 ~ /\($/); next }
    skip { if ($0 ~ /^\)/) skip = 0; next }
    /^replace \($/ { print "require k8s.io/kubernetes " k "\n"; inrep = 1; print; next }
    inrep && /^\)/ { inrep = 0 }
    inrep { sub(/v0\.[0-9]+\.[0-9]+$/, s) }
    { print }' "$here/go/$name/go.mod" >"$dir/go.mod"
  (cd "$dir" && go mod tidy)
  echo "$pin_key" >"$dir/.pin"
}

locked etcd build etcd "" "" etcd=go.etcd.io/etcd/server/v3
kube=(kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl)
if [[ $want != integration ]]; then
  kube+=(kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
         kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler)
fi
if [[ $kube_version == "$kube_pin" ]]; then
  locked k8s build k8s "$kube_ld" "" "${kube[@]}"
else
  locked "k8s-$kube_version" kube_wrapper k8s
  GO_DIR=$kube_go BIN_DIR=$kube_bin locked "k8s-$kube_version" build k8s "$kube_ld" "" "${kube[@]}"
fi
if [[ $want != integration ]]; then
  locked kwok build kwok "" "" kwok=sigs.k8s.io/kwok/cmd/kwok
fi
# `autoscaler` is what `make demo` runs: the cluster and cluster-autoscaler, nothing else.
if [[ $want != integration && $want != cluster ]]; then
  locked cluster-autoscaler build_cluster_autoscaler
fi
# The real machines of src/machine/: a kubelet at the control plane's pin (go/kubelet, a sibling
# of go/k8s so that the control plane's key is untouched) with Kubernetes' sample device plugin
# from the same module (it advertises two devices of example.com/resource), containerd with its
# runc shim and ctr, runc, the CNI plugins that wire a pod (into $bin/cni/, containerd's CNI bin
# dir) and our own pause program (the sandbox image and test workload; no registry serves one). All static
# with cgo off except runc, whose nsenter is C. runc needs the `seccomp` tag: the kubelet asks
# for the RuntimeDefault seccomp profile for every pod sandbox, whatever the pod says, and a
# runc without seccomp fails those ("config provided but seccomp not supported"). So it links
# libseccomp, statically (as runc's releases do), from Debian's libseccomp-dev, installed here
# if missing. containerd's btrfs, devmapper and zfs snapshotters are left out (overlayfs only).
# Cold build times on the 2-core dev machine are in src/machine/mod.rs. They come first in their
# profile: the build beside the suites (`make test`, profile `all`) makes them while the first
# suites run, before the e2e programs, which no real-machine suite waits on.
ensure_libseccomp() {
  [[ -x "${HOMELAB_TEST_ASSETS:-/nonexistent}/runc" ]] && return 0
  [[ -x "$bin/runc" && "$(cat "$(key_file runc)" 2>/dev/null)" == "$(wrapper_key runc)" ]] && return 0
  pkg-config --exists libseccomp 2>/dev/null && return 0
  if ! command -v apt-get >/dev/null; then
    log "runc needs libseccomp's headers and static library (Debian: libseccomp-dev) and pkg-config"
    return 1
  fi
  log "installing Debian's libseccomp-dev (runc links libseccomp)"
  local sudo=""; [[ $(id -u) -eq 0 ]] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null
}
build_runc() {
  ensure_libseccomp
  CGO_ENABLED=1 build runc "-extldflags=-static" "seccomp netgo osusergo" runc=github.com/opencontainers/runc
}
if [[ $want == machines || $want == all ]]; then
  if [[ $kube_version == "$kube_pin" ]]; then
    locked kubelet build kubelet "$kube_ld" "" kubelet=k8s.io/kubernetes/cmd/kubelet \
      sample-device-plugin=k8s.io/kubernetes/test/images/sample-device-plugin
  else
    locked "kubelet-$kube_version" kube_wrapper kubelet
    GO_DIR=$kube_go BIN_DIR=$kube_bin locked "kubelet-$kube_version" build kubelet "$kube_ld" "" \
      kubelet=k8s.io/kubernetes/cmd/kubelet \
      sample-device-plugin=k8s.io/kubernetes/test/images/sample-device-plugin
  fi
  locked containerd build containerd "" "no_btrfs,no_devmapper,no_zfs" \
    containerd=github.com/containerd/containerd/v2/cmd/containerd \
    containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    ctr=github.com/containerd/containerd/v2/cmd/ctr
  locked runc build_runc
  mkdir -p "$bin/cni"
  locked cni build cni "" "" cni/bridge=github.com/containernetworking/plugins/plugins/main/bridge \
    cni/host-local=github.com/containernetworking/plugins/plugins/ipam/host-local \
    cni/loopback=github.com/containernetworking/plugins/plugins/main/loopback
  locked pause build pause "" "" pause=homelab-autoscaler.invalid/harness/pause
  # The image is packed with crane (the e2e profile below finds it built).
  locked crane build crane "" "" crane=github.com/google/go-containerregistry/cmd/crane
  locked pause-image build_pause_image
fi
# `storage` adds rancher's local-path-provisioner, for the suites of pods whose volume lives on
# one machine; every larger profile holds it too.
if [[ $want == storage || $want == e2e || $want == all ]]; then
  locked local-path-provisioner build local-path-provisioner "" "" \
    local-path-provisioner=github.com/rancher/local-path-provisioner
fi
# Longhorn's CustomResourceDefinitions, for the suite whose gate reads Longhorn's volumes: a file
# of its manager's published module (k8s/crds.yaml, the CRD part of Longhorn's Helm chart), not
# a program. The module is downloaded, checked against go/longhorn-crds/go.sum, and the file
# copied, keyed like a binary by its wrapper.
fetch_longhorn_crds() {
  local name=longhorn-crds.yaml key dir
  key=$(wrapper_key longhorn-crds)
  if [[ -f "$bin/$name" && "$(cat "$(key_file "$name")" 2>/dev/null)" == "$key" ]]; then
    log "$name: cached"; return 0
  fi
  dir=$(cd "$here/go/longhorn-crds" && go mod download -json github.com/longhorn/longhorn-manager |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [[ -f $dir/k8s/crds.yaml ]] || { log "longhorn-manager's module holds no k8s/crds.yaml"; return 1; }
  install -m 0644 "$dir/k8s/crds.yaml" "$bin/$name.tmp" && mv -f "$bin/$name.tmp" "$bin/$name"
  echo "$key" > "$(key_file "$name")"
  log "$name: from $(basename "$dir")"
}
if [[ $want == e2e || $want == all ]]; then
  locked longhorn-crds fetch_longhorn_crds
  locked helm build helm "$helm_ld" "" helm=helm.sh/helm/v3/cmd/helm
  locked crane build crane "" "" crane=github.com/google/go-containerregistry/cmd/crane
  locked cert-manager build_cert_manager
fi
# Prometheus and promtool, for the metrics suite: a real scraper and the upstream linter of the
# exposition format. `remove_all_sd` leaves out the cloud service-discovery plugins (the tests
# use static_configs; their SDKs are most of Prometheus's dependencies), and without the
# `builtinassets` tag the web UI is not embedded (the API serves without it). Cold build time
# on the 2-core dev machine: docs/testing.md.
if [[ $want == e2e || $want == all ]]; then
  locked prometheus build prometheus "" "remove_all_sd" \
    prometheus=github.com/prometheus/prometheus/cmd/prometheus \
    promtool=github.com/prometheus/prometheus/cmd/promtool
fi
if [[ $kube_version == "$kube_pin" ]]; then
  echo "$bin"
else
  # The directory the harness reads: every program of $bin but the Kubernetes ones, which are
  # this release's (one not built for this profile is left out). Links are only added (a
  # directory becomes a directory of links), so a suite reading the view never finds it half made.
  view=$cache/kube-$kube_version/view
  make_view() {
    local f g name
    mkdir -p "$view"
    for f in "$bin"/*; do
      name=${f##*/}
      [[ " ${kube_programs[*]} " == *" $name "* ]] && continue
      if [[ -d $f ]]; then
        # A directory of links, not a link: `kubectl apply -f DIR` follows no link to a directory.
        [[ -L $view/$name ]] && rm -f "$view/$name"
        mkdir -p "$view/$name"
        for g in "$f"/*; do
          if [[ ! -L $view/$name/${g##*/} ]]; then ln -s "$g" "$view/$name/"; fi
        done
      elif [[ ! -L $view/$name ]]; then
        ln -s "$f" "$view/"
      fi
    done
    for f in "${kube_programs[@]}"; do
      if [[ -x $kube_bin/$f && ! -L $view/$f ]]; then ln -s "$kube_bin/$f" "$view/"; fi
    done
  }
  locked "view-$kube_version" make_view
  echo "$view"
fi
