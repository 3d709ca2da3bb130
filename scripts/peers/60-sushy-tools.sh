#!/usr/bin/env bash
# sushy-tools' Redfish emulator (PyPI sushy-tools, fake driver: no libvirt) for
# provider-baremetal's Redfish tests, in a virtualenv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/sushy-tools; and xorriso, the ISO
# tool the tests read the NoCloud seed back with.
# Idempotent: a venv that already has the pinned version is left alone.
set -euo pipefail

venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/sushy-tools"
sushy_tools_version=2.2.0

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

if [ -x "$venv/bin/sushy-emulator" ] &&
  [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("sushy-tools"))' 2>/dev/null)" = "$sushy_tools_version" ]; then
  echo "sushy-tools already installed in $venv ($sushy_tools_version)"
  exit 0
fi

# Debian's python3 needs python3-venv for `python3 -m venv` to bring pip along.
if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt_install python3 python3-venv
fi

mkdir -p "$(dirname "$venv")"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "sushy-tools==$sushy_tools_version"
echo "sushy-tools installed in $venv ($sushy_tools_version)"
