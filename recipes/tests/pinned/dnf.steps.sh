#!/bin/sh
# machine-core step layer "base": 3 steps
set -eu
state=/var/lib/machine-core/layers/base.done
mkdir -p "$(dirname "$state")"
touch "$state"
# step 1: write /etc/pki/rpm-gpg/RPM-GPG-KEY-example
if ! grep -qx 4ff8034e342cb87d140025afca6881cc "$state"; then
  mkdir -p "$(dirname /etc/pki/rpm-gpg/RPM-GPG-KEY-example)"
  printf '%s' 'LS0tLS1CRUdJTiBQR1AgUFVCTElDIEtFWSBCTE9DSy0tLS0tCgptRE1FWlhoaGJYQnNaUT09Cj1hYmNkCi0tLS0tRU5EIFBHUCBQVUJMSUMgS0VZIEJMT0NLLS0tLS0K' | base64 -d > /etc/pki/rpm-gpg/RPM-GPG-KEY-example.machine-core-tmp
  chmod 644 /etc/pki/rpm-gpg/RPM-GPG-KEY-example.machine-core-tmp
  mv -f /etc/pki/rpm-gpg/RPM-GPG-KEY-example.machine-core-tmp /etc/pki/rpm-gpg/RPM-GPG-KEY-example
  echo 4ff8034e342cb87d140025afca6881cc >> "$state"
fi
# step 2: write /etc/yum.repos.d/example.repo
if ! grep -qx 18dcf447eb71fff68e770200d32bc5ff "$state"; then
  mkdir -p "$(dirname /etc/yum.repos.d/example.repo)"
  printf '%s' 'W2V4YW1wbGVdCm5hbWU9RXhhbXBsZSBwYWNrYWdlcwpiYXNldXJsPWh0dHBzOi8vcnBtLmV4YW1wbGUuaW52YWxpZC9lbC8kcmVsZWFzZXZlci8KZW5hYmxlZD0xCmdwZ2NoZWNrPTEKZ3Bna2V5PWZpbGU6Ly8vZXRjL3BraS9ycG0tZ3BnL1JQTS1HUEctS0VZLWV4YW1wbGUK' | base64 -d > /etc/yum.repos.d/example.repo.machine-core-tmp
  chmod 644 /etc/yum.repos.d/example.repo.machine-core-tmp
  mv -f /etc/yum.repos.d/example.repo.machine-core-tmp /etc/yum.repos.d/example.repo
  echo 18dcf447eb71fff68e770200d32bc5ff >> "$state"
fi
# step 3: run sh -ec 'command -v rpm >/dev/null || { echo '\''rpm not found: these packages are for the dnf family'\'' >&2; exit 1; }
if ! grep -qx 3cf12c9d9d86689c1bb1411afdc0aae4 "$state"; then
  sh -c "sh -ec 'command -v rpm >/dev/null || { echo '\\''rpm not found: these packages are for the dnf family'\\'' >&2; exit 1; }
if "'! { rpm -q --quiet kubectl-1.31.2; }; then
  if command -v dnf >/dev/null; then pm=dnf; elif command -v yum >/dev/null; then pm='"'\\''yum -t'\\''; else echo '\\''neither dnf nor yum found'\\'' >&2; exit 1; fi
  "'$pm -y makecache
  $pm -y install kubectl-1.31.2
fi
'"'"
  echo 3cf12c9d9d86689c1bb1411afdc0aae4 >> "$state"
fi
