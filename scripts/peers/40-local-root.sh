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
# Bench-only (WITH_BENCH_PEERS=1): a copy of that root with what Ansible's modules need on
# a managed host and the packages the recipes benchmark installs, so that both sides find
# them installed and apt stays offline: python3-apt (the apt module), kmod (modprobe),
# systemd (systemctl for the systemd_service module; not PID 1), nginx and curl. The
# tests' root above is unchanged.
bench="$cache/bookworm-bench"
if [ "${WITH_BENCH_PEERS:-0}" = 1 ] && [ ! -x "$bench/usr/bin/systemctl" ]; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
  rm -rf "$bench.tmp"
  echo "adding python3-apt, kmod, systemd, nginx, curl to a copy of $root as $bench (a minute, once)"
  cp -a "$root" "$bench.tmp"
  echo "deb $mirror bookworm main" > "$bench.tmp/etc/apt/sources.list"
  cp /etc/resolv.conf "$bench.tmp/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$bench.tmp/usr/sbin/policy-rc.d"
  chmod 755 "$bench.tmp/usr/sbin/policy-rc.d"
  unshare --mount --propagation private sh -ec '
    mount --rbind /dev "$1/dev"; mount -t proc proc "$1/proc"
    chroot "$1" sh -ec "export DEBIAN_FRONTEND=noninteractive; apt-get update -q
      apt-get install -y -q --no-install-recommends python3-apt kmod systemd nginx curl
      apt-get clean; rm -rf /var/lib/apt/lists/*"' sh "$bench.tmp" > "$bench.log" 2>&1 \
    || { tail -n 20 "$bench.log"; exit 1; }
  rm -f "$bench.tmp"/etc/ssh/ssh_host_*
  rm -f "$bench.tmp/usr/sbin/policy-rc.d"
  mv "$bench.tmp" "$bench"
fi
if [ "${WITH_BENCH_PEERS:-0}" = 1 ]; then echo "bench machine root: $bench"; fi
echo "local machine root: $root ($(chroot "$root" /usr/sbin/sshd -V 2>&1 | head -n1))"
