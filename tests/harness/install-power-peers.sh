#!/usr/bin/env bash
# Installs the real protocol peers the power-driver tests talk to (tests/power_*.rs):
#   - ipmi_sim and ipmitool (Debian `openipmi`, `ipmitool`): an IPMI BMC over RMCP+;
#   - sshd (Debian `openssh-server`): the SSH shutdown;
#   - sushy-emulator (PyPI `sushy-tools`, in a virtualenv under the cache): a Redfish BMC;
#   - fakebmc (PyPI `pyghmi`, same virtualenv): an IPMI BMC that does not answer the RMCP ping;
#   - Ceph (Debian `ceph-mon`, `ceph-mgr`, `ceph-osd`, `ceph-common`): the storage the power-off
#     gates guard (tests/power_off_gates.rs, tests/harness/src/ceph.rs);
#   - Network UPS Tools' upsd and dummy-ups driver (Debian `nut-server`, `libupsclient6`): a UPS
#     (tests/harness/src/power_peers.rs, UpsPeer). Unpacked with `dpkg -x` under $PEERS/nut,
#     not installed: the package's maintainer scripts would set up and start host services.
# Idempotent and quick when everything is there. Nothing lands in the repository.
set -euo pipefail

CACHE="${HOMELAB_TEST_CACHE:-$HOME/.cache/homelab-autoscaler}"
PEERS="$CACHE/peers"
SUSHY_VERSION="2.2.0"
PYGHMI_VERSION="1.6.19"

missing=()
command -v ipmi_sim >/dev/null 2>&1 || missing+=(openipmi)
command -v ipmitool >/dev/null 2>&1 || missing+=(ipmitool)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
for ceph in ceph-mon ceph-mgr ceph-osd; do
  [ -x "/usr/bin/$ceph" ] || missing+=("$ceph")
done
command -v ceph >/dev/null 2>&1 || missing+=(ceph-common)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-power-peers: installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

installed() {
  [ -x "$PEERS/venv/bin/sushy-emulator" ] && [ -x "$PEERS/venv/bin/python" ] \
    && compgen -G "$PEERS/venv/lib/python3*/site-packages/sushy_tools-$SUSHY_VERSION.dist-info" >/dev/null \
    && "$PEERS/venv/bin/python" -c 'import bcrypt' 2>/dev/null \
    && venv_in_place
}
# A venv's scripts name its interpreter by absolute path: a cache moved or copied elsewhere
# keeps them, and they no longer start.
venv_in_place() {
  local script
  for script in "$PEERS/venv/bin/sushy-emulator" "$PEERS/venv/bin/fakebmc"; do
    [ -e "$script" ] || continue
    [ "$(head -c 200 "$script" | head -n 1)" = "#!$PEERS/venv/bin/python3" ] || return 1
  done
}
if ! installed; then
  echo "install-power-peers: installing sushy-tools $SUSHY_VERSION into $PEERS/venv"
  mkdir -p "$PEERS"
  rm -rf "$PEERS/venv"
  python3 -m venv "$PEERS/venv"
  # bcrypt: the tests hash the emulator's htpasswd with it (sushy-tools needs it too).
  "$PEERS/venv/bin/pip" install -q --disable-pip-version-check "sushy-tools==$SUSHY_VERSION" bcrypt
fi
# pyghmi is checked on its own, so adding it to an existing virtualenv does not rebuild it.
if ! [ -x "$PEERS/venv/bin/fakebmc" ] \
  || ! compgen -G "$PEERS/venv/lib/python3*/site-packages/pyghmi-$PYGHMI_VERSION.dist-info" >/dev/null; then
  echo "install-power-peers: installing pyghmi $PYGHMI_VERSION into $PEERS/venv"
  "$PEERS/venv/bin/pip" install -q --disable-pip-version-check "pyghmi==$PYGHMI_VERSION"
fi
# NUT: the packages' files only, unpacked under $PEERS/nut (lib/nut/upsd, lib/nut/dummy-ups, and
# libupsclient in lib/<multiarch>). No apt-get install: its postinst touches the host's services.
# (sbin/upsd in there is a wrapper script for the host's paths; the tests run lib/nut/upsd.)
nut_libs() {
  LD_LIBRARY_PATH="$(compgen -G "$PEERS/nut/lib/*-linux-gnu" | head -n1)" \
    ldd "$PEERS/nut/lib/nut/upsd" "$PEERS/nut/lib/nut/dummy-ups" 2>&1 | grep 'not found' || true
}
if ! [ -x "$PEERS/nut/lib/nut/upsd" ] || ! [ -x "$PEERS/nut/lib/nut/dummy-ups" ] \
  || ! compgen -G "$PEERS/nut/lib/*-linux-gnu/libupsclient.so.6" >/dev/null; then
  echo "install-power-peers: unpacking nut-server and libupsclient6 into $PEERS/nut"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  debs=$(mktemp -d)
  chmod 755 "$debs" # apt's _apt user downloads into it
  trap 'rm -rf "$debs"' EXIT
  if ! (cd "$debs" && apt-get download -qq nut-server libupsclient6 >/dev/null 2>&1); then
    # The package lists may be missing (a fresh container): fetch them and try once more.
    $SUDO apt-get update -qq
    (cd "$debs" && apt-get download -qq nut-server libupsclient6 >/dev/null)
  fi
  rm -rf "$PEERS/nut"
  mkdir -p "$PEERS/nut"
  for deb in "$debs"/*.deb; do
    dpkg -x "$deb" "$PEERS/nut"
  done
  rm -rf "$debs"
  trap - EXIT
  for bin in upsd dummy-ups; do
    [ -x "$PEERS/nut/lib/nut/$bin" ] || {
      echo "install-power-peers: $PEERS/nut/lib/nut/$bin is missing after unpacking" >&2
      exit 1
    }
  done
fi
# The shared libraries upsd links against (plain library packages, no services to start).
if [ -n "$(nut_libs)" ]; then
  echo "install-power-peers: installing the libraries NUT needs: libnspr4 libnss3 libwrap0"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends libnspr4 libnss3 libwrap0 >/dev/null
  missing_libs=$(nut_libs)
  if [ -n "$missing_libs" ]; then
    echo "install-power-peers: NUT still misses libraries:" >&2
    echo "$missing_libs" >&2
    exit 1
  fi
fi
echo "install-power-peers: ready (ipmi_sim, ipmitool, sshd, $PEERS/venv/bin/sushy-emulator, $PEERS/venv/bin/fakebmc, ceph, $PEERS/nut/lib/nut/upsd)"
