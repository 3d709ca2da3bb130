#!/usr/bin/env bash
# Peers of bootstrap-cloudinit: Debian's cloud-init (its schema validator, its Python
# with PyYAML, its status command) and Debian's Ignition (ignition-validate).
set -euo pipefail
need=()
[ -x /usr/bin/cloud-init ] || need+=(cloud-init)
[ -x /usr/bin/ignition-validate ] || need+=(ignition)
[ -x /usr/bin/python3 ] || need+=(python3)
command -v gzip >/dev/null || need+=(gzip)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
if [ "${#need[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi
cloud-init --version
ignition-validate --version
