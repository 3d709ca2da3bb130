#!/usr/bin/env bash
# Installs the SSH peers of bootstrap-ssh's tests: Debian's openssh-server (sshd, which
# the tests start themselves on free ports and in network namespaces), openssh-client
# (ssh-keygen for host and user keys, ssh for the benchmark), iproute2 (ip netns) and
# sudo (the tests run commands through `sudo -n`), busybox (the command supervisor is
# tested under busybox's sh and applets too).
# With WITH_BENCH_PEERS=1 it also installs ansible-core into a venv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/ansible, for the bench_ssh example,
# and the ansible package (its collections) for bench_recipes_ansible.
# Idempotent: quick when everything is already there.
set -euo pipefail

need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh-keygen >/dev/null 2>&1 && command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v sudo >/dev/null 2>&1 || need+=(sudo)
command -v busybox >/dev/null 2>&1 || need+=(busybox)
if [ "${WITH_BENCH_PEERS:-0}" = 1 ]; then
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
  # The package enables and may start a system sshd; the tests run their own.
fi
mkdir -p /run/sshd

if [ "${WITH_BENCH_PEERS:-0}" = 1 ]; then
  venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/ansible"
  if [ ! -x "$venv/bin/ansible-playbook" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q ansible-core
  fi
  # bench_recipes_ansible also needs the community.general and ansible.posix collections
  # (timezone, sysctl, authorized_key): the `ansible` package of the version measured with.
  if [ ! -d "$("$venv/bin/python3" -c 'import ansible, os; print(os.path.dirname(os.path.dirname(ansible.__file__)))')/ansible_collections/community/general" ]; then
    "$venv/bin/pip" install -q 'ansible==12.3.0'
  fi
  "$venv/bin/ansible-playbook" --version | sed -n 1p
fi
echo "openssh peers ready: $(/usr/sbin/sshd -V 2>&1 | head -1)"
