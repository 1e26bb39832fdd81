#!/usr/bin/env bash
# Builds the upstream programs the test suite runs against, from the pinned Go wrapper
# modules beside this script, into a cache outside the repository. Idempotent: a binary is
# rebuilt only when its wrapper's go.mod/go.sum change. Prints the binary directory last.
#
#   build-binaries.sh [integration|cluster|autoscaler|storage|e2e|machines|all]   (default: cluster)
#
# `machines` is `e2e` plus the programs of the harness's real machines (kubelet, containerd,
# runc, CNI plugins, our pause); no other profile builds those.
#
# Environment:
#   HOMELAB_TEST_ASSETS  a directory of prebuilt binaries (as envtest's KUBEBUILDER_ASSETS);
#                        any program found there is used as is and not built.
#   HOMELAB_TEST_CACHE   where built binaries live (default: ~/.cache/homelab-autoscaler).
#   HOMELAB_CA_SOURCE    cluster-autoscaler's source (a module directory or a .tar.gz of it);
#                        default: ../shared/upstream/cluster-autoscaler/, else a git clone.
#   HOMELAB_CERT_MANAGER_SOURCE  cert-manager's cmd source tarball (controller/, cainjector/,
#                        crds/); default: ../shared/upstream/cert-manager/, else a git clone.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${HOMELAB_TEST_CACHE:-$HOME/.cache/homelab-autoscaler}
bin="$cache/bin"
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local

kube_version=v1.36.3
kube_ld=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ld+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=1 -X $p.gitMinor=36"
  kube_ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
helm_ld="-X helm.sh/helm/v3/internal/version.version=v3.21.4"
for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
  helm_ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=36"
done

log() { printf '[build-binaries] %s\n' "$*" >&2; }

# wrapper_key DIR: a hash of what pins the build, so a changed pin rebuilds.
# A wrapper whose go.sum is not written yet (GOFLAGS=-mod=mod writes it) hashes its go.mod alone.
wrapper_key() {
  { cat "$here/go/$1/go.mod"; cat "$here/go/$1/go.sum" 2>/dev/null || true; } | sha256sum | cut -c1-16
}

# key_file NAME: where the key of binary NAME is kept (NAME may be in a subdirectory: cni/bridge).
key_file() { echo "$bin/$(dirname "$1")/.$(basename "$1").key"; }

# build WRAPPER "LDFLAGS" "TAGS" NAME=PACKAGE...
build() {
  local wrapper=$1 ldflags=$2 tags=$3; shift 3
  local key missing=() pkgs=() names=()
  key=$(wrapper_key "$wrapper")
  for pair in "$@"; do
    local name=${pair%%=*} pkg=${pair#*=}
    if [[ -n "${HOMELAB_TEST_ASSETS:-}" && -x "$HOMELAB_TEST_ASSETS/$name" ]]; then
      ln -sf "$HOMELAB_TEST_ASSETS/$name" "$bin/$name"; echo "prebuilt" > "$(key_file "$name")"
      log "$name: prebuilt from HOMELAB_TEST_ASSETS"; continue
    fi
    if [[ -x "$bin/$name" && "$(cat "$(key_file "$name")" 2>/dev/null)" == "$key" ]]; then
      log "$name: cached"; continue
    fi
    missing+=("$name"); pkgs+=("$pkg"); names+=("$name")
  done
  ((${#missing[@]})) || return 0
  log "building ${missing[*]} from go/$wrapper (this is slow the first time; Go's caches make it fast after)"
  local out start; out=$(mktemp -d "$cache/build.XXXXXX"); start=$(date +%s)
  (cd "$here/go/$wrapper" && go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags -s -w" -o "$out/" "${pkgs[@]}")
  local i
  for i in "${!names[@]}"; do
    # go build names a binary after the package path's last element, skipping a /vN suffix.
    local elem; elem=$(basename "${pkgs[$i]}")
    [[ $elem =~ ^v[0-9]+$ ]] && elem=$(basename "$(dirname "${pkgs[$i]}")")
    local built="$out/$elem"
    mv -f "$built" "$bin/${names[$i]}"
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
  (cd "$module" && GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -tags externalgrpc \
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
    (cd "$root/${name#cert-manager-}" && GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath \
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
  integration|cluster|autoscaler|storage|e2e|machines|all) ;;
  *) echo "usage: $0 [integration|cluster|autoscaler|storage|e2e|machines|all]" >&2; exit 2 ;;
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

locked etcd build etcd "" "" etcd=go.etcd.io/etcd/server/v3
kube=(kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl)
if [[ $want != integration ]]; then
  kube+=(kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager
         kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler)
fi
locked k8s build k8s "$kube_ld" "" "${kube[@]}"
if [[ $want != integration ]]; then
  locked kwok build kwok "" "" kwok=sigs.k8s.io/kwok/cmd/kwok
fi
# `autoscaler` is what `make demo` runs: the cluster and cluster-autoscaler, nothing else.
if [[ $want != integration && $want != cluster ]]; then
  locked cluster-autoscaler build_cluster_autoscaler
fi
# `storage` adds rancher's local-path-provisioner, for the suites of pods whose volume lives on
# one machine; every larger profile holds it too, so the build beside the suites makes it first.
if [[ $want == storage || $want == e2e || $want == machines || $want == all ]]; then
  locked local-path-provisioner build local-path-provisioner "" "" \
    local-path-provisioner=github.com/rancher/local-path-provisioner
fi
if [[ $want == e2e || $want == machines || $want == all ]]; then
  locked helm build helm "$helm_ld" "" helm=helm.sh/helm/v3/cmd/helm
  locked crane build crane "" "" crane=github.com/google/go-containerregistry/cmd/crane
  locked cert-manager build_cert_manager
fi
# Prometheus and promtool, for the metrics suite: a real scraper and the upstream linter of the
# exposition format. `remove_all_sd` leaves out the cloud service-discovery plugins (the tests
# use static_configs; their SDKs are most of Prometheus's dependencies), and without the
# `builtinassets` tag the web UI is not embedded (the API serves without it). Cold build time
# on the 2-core dev machine: docs/testing.md.
if [[ $want == e2e || $want == machines || $want == all ]]; then
  locked prometheus build prometheus "" "remove_all_sd" \
    prometheus=github.com/prometheus/prometheus/cmd/prometheus \
    promtool=github.com/prometheus/prometheus/cmd/promtool
fi
# The real machines of src/machine/: a kubelet at the control plane's pin (go/kubelet, a sibling
# of go/k8s so that the control plane's key is untouched), containerd with its runc shim and
# ctr, runc, the CNI plugins that wire a pod (into $bin/cni/, containerd's CNI bin dir) and our
# own pause program (the sandbox image and test workload; no registry serves one). All static
# with cgo off except runc, whose nsenter is C. runc needs the `seccomp` tag: the kubelet asks
# for the RuntimeDefault seccomp profile for every pod sandbox, whatever the pod says, and a
# runc without seccomp fails those ("config provided but seccomp not supported"). So it links
# libseccomp, statically (as runc's releases do), from Debian's libseccomp-dev, installed here
# if missing. containerd's btrfs, devmapper and zfs snapshotters are left out (overlayfs only).
# Cold build times on the 2-core dev machine are in src/machine/mod.rs.
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
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libseccomp-dev pkg-config >/dev/null
}
build_runc() {
  ensure_libseccomp
  CGO_ENABLED=1 build runc "-extldflags=-static" "seccomp netgo osusergo" runc=github.com/opencontainers/runc
}
if [[ $want == machines ]]; then
  locked kubelet build kubelet "$kube_ld" "" kubelet=k8s.io/kubernetes/cmd/kubelet
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
  locked pause-image build_pause_image
fi
echo "$bin"
