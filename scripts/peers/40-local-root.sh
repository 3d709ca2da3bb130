#!/usr/bin/env bash
# Peer of provider-local: the Debian 12 root its machines boot from. It is the
# cloud-init root of 20-cloud-init.sh plus openssh-server, sudo and python3, with no
# SSH host keys (each machine generates its own at first boot), kept in the user cache
# as bookworm-local. provider-local refuses a root without these.
set -euo pipefail
cache="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning"
base="$cache/bookworm-cloud-init"
root="$cache/bookworm-local"
[ -x "$base/usr/bin/cloud-init" ] || { echo "$base is missing: run 20-cloud-init.sh first" >&2; exit 1; }
command -v ip >/dev/null || { apt-get update -q; apt-get install -y -q --no-install-recommends iproute2; }
if [ ! -x "$root/usr/sbin/sshd" ] || [ ! -x "$root/usr/bin/sudo" ] || [ ! -x "$root/usr/bin/cloud-init" ]; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
  rm -rf "$root.tmp"
  echo "adding openssh-server, sudo, python3 to a copy of $base as $root (a minute, once)"
  cp -a "$base" "$root.tmp"
  echo "deb $mirror bookworm main" > "$root.tmp/etc/apt/sources.list"
  cp /etc/resolv.conf "$root.tmp/etc/resolv.conf"
  # Packages must not start services on this host while they install.
  printf '#!/bin/sh\nexit 101\n' > "$root.tmp/usr/sbin/policy-rc.d"
  chmod 755 "$root.tmp/usr/sbin/policy-rc.d"
  # A private mount namespace: /dev and /proc are gone with it, even when apt fails.
  unshare --mount --propagation private sh -ec '
    mount --rbind /dev "$1/dev"; mount -t proc proc "$1/proc"
    chroot "$1" sh -ec "export DEBIAN_FRONTEND=noninteractive; apt-get update -q
      apt-get install -y -q --no-install-recommends openssh-server sudo python3
      apt-get clean; rm -rf /var/lib/apt/lists/*"' sh "$root.tmp" > "$root.log" 2>&1 \
    || { tail -n 20 "$root.log"; exit 1; }
  rm -f "$root.tmp"/etc/ssh/ssh_host_*
  rm -f "$root.tmp/usr/sbin/policy-rc.d"
  mv "$root.tmp" "$root"
fi
echo "local machine root: $root ($(chroot "$root" /usr/sbin/sshd -V 2>&1 | head -n1))"
