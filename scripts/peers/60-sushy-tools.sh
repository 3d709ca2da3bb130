#!/usr/bin/env bash
# sushy-tools' Redfish emulator (PyPI sushy-tools, fake driver: no libvirt) for
# provider-baremetal's Redfish tests, in a virtualenv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/sushy-tools; and xorriso, the ISO
# tool the tests read the NoCloud seed back with.
# With WITH_BENCH_PEERS=1 it also installs the sushy client library (PyPI sushy, the
# Redfish library of OpenStack Ironic) into a venv of its own under
# ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/sushy-client, for the bench_redfish
# example (apart from the emulator's venv, so that neither pins the other's dependencies).
# Idempotent: a venv that already has the pinned version is left alone.
set -euo pipefail

venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/sushy-tools"
sushy_tools_version=2.2.0
client_venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/sushy-client"
sushy_version=5.14.0

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then
    apt-get update
    apt_updated=1
  fi
  # Wait for another apt (a parallel peer script) rather than fail on its lock.
  apt-get -o DPkg::Lock::Timeout=300 install -y "$@"
}

if ! command -v xorriso >/dev/null; then
  apt_install xorriso
fi

installed_version() { # venv package
  "$1/bin/python" -c "import importlib.metadata as m; print(m.version('$2'))" 2>/dev/null || true
}

# Debian's python3 needs python3-venv for `python3 -m venv` to bring pip along.
if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt_install python3 python3-venv
fi

if [ -x "$venv/bin/sushy-emulator" ] &&
  [ "$(installed_version "$venv" sushy-tools)" = "$sushy_tools_version" ]; then
  echo "sushy-tools already installed in $venv ($sushy_tools_version)"
else
  mkdir -p "$(dirname "$venv")"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "sushy-tools==$sushy_tools_version"
  echo "sushy-tools installed in $venv ($sushy_tools_version)"
fi

if [ "${WITH_BENCH_PEERS:-0}" = 1 ]; then
  if [ "$(installed_version "$client_venv" sushy)" = "$sushy_version" ]; then
    echo "sushy already installed in $client_venv ($sushy_version)"
  else
    rm -rf "$client_venv"
    python3 -m venv "$client_venv"
    "$client_venv/bin/pip" install --quiet --disable-pip-version-check "sushy==$sushy_version"
    echo "sushy installed in $client_venv ($sushy_version)"
  fi
fi
