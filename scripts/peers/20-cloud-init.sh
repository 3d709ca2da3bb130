#!/usr/bin/env bash
# Peers of bootstrap-cloudinit: Debian's cloud-init (its schema validator, its Python
# with PyYAML, its status command, its phone_home module), Debian's Ignition
# (ignition-validate), ssh-keygen, and a Debian 12 root file system with cloud-init in
# the user cache, in which the tests run cloud-init's real boot stages.
set -euo pipefail
need=()
[ -x /usr/bin/cloud-init ] || need+=(cloud-init)
[ -x /usr/bin/ignition-validate ] || need+=(ignition)
[ -x /usr/bin/python3 ] || need+=(python3)
[ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ -x /usr/bin/unshare ] || need+=(util-linux)
command -v gzip >/dev/null || need+=(gzip)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
# ip and nsenter: the phone-home tests give the booted root a network namespace of their own.
command -v ip >/dev/null || need+=(iproute2)
[ -x /usr/bin/nsenter ] || need+=(util-linux)
if [ "${#need[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi
cloud-init --version
ignition-validate --version

root="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/bookworm-cloud-init"
if [ ! -x "$root/usr/bin/cloud-init" ]; then
  # The mirror apt is configured with on this machine.
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
  mkdir -p "$(dirname "$root")"
  rm -rf "$root.tmp"
  echo "debootstrap bookworm with cloud-init into $root (a few minutes, once)"
  debootstrap --variant=minbase --include=cloud-init,python3-cffi-backend,openssh-client \
    bookworm "$root.tmp" "$mirror" > "$root.log" 2>&1 || { tail -n 20 "$root.log"; exit 1; }
  mv "$root.tmp" "$root"
fi
echo "cloud-init root: $root ($(chroot "$root" cloud-init --version 2>&1))"
