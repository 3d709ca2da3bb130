#!/bin/sh
# machine-core step layer "base": 3 steps
set -eu
state=/var/lib/machine-core/layers/base.done
mkdir -p "$(dirname "$state")"
touch "$state"
# step 1: run sh -ec 'command -v rpm >/dev/null || { echo '\''rpm not found: repository example is for the zypper family'\'' >&2; exit 1; }
if ! grep -qx 76cf06f3f25a72f049809a46e112686f "$state"; then
  sh -c "sh -ec 'command -v rpm >/dev/null || { echo '\\''rpm not found: repository example is for the zypper family'\\'' >&2; exit 1; }
mkdir -p /etc/pki/rpm-gpg
printf '\\''%s'\\'' '\\''-----BEGIN PGP PUBLIC KEY BLOCK-----

mDMEZXhhbXBsZQ==
=abcd
-----END PGP PUBLIC KEY BLOCK-----
'\\'' > /etc/pki/rpm-gpg/RPM-GPG-KEY-example.recipes-tmp
chmod 0644 /etc/pki/rpm-gpg/RPM-GPG-KEY-example.recipes-tmp
mv -f /etc/pki/rpm-gpg/RPM-GPG-KEY-example.recipes-tmp /etc/pki/rpm-gpg/RPM-GPG-KEY-example
rpm --import /etc/pki/rpm-gpg/RPM-GPG-KEY-example
'"
  echo 76cf06f3f25a72f049809a46e112686f >> "$state"
fi
# step 2: write /etc/zypp/repos.d/example.repo
if ! grep -qx 09343f1be403bdc679261bef67cf6c04 "$state"; then
  mkdir -p "$(dirname /etc/zypp/repos.d/example.repo)"
  printf '%s' 'W2V4YW1wbGVdCm5hbWU9ZXhhbXBsZQplbmFibGVkPTEKYXV0b3JlZnJlc2g9MQpiYXNldXJsPWh0dHBzOi8vcnBtLmV4YW1wbGUuaW52YWxpZC9zdXNlLwp0eXBlPXJwbS1tZApncGdjaGVjaz0xCmdwZ2tleT1maWxlOi8vL2V0Yy9wa2kvcnBtLWdwZy9SUE0tR1BHLUtFWS1leGFtcGxlCg==' | base64 -d > /etc/zypp/repos.d/example.repo.machine-core-tmp
  chmod 644 /etc/zypp/repos.d/example.repo.machine-core-tmp
  mv -f /etc/zypp/repos.d/example.repo.machine-core-tmp /etc/zypp/repos.d/example.repo
  echo 09343f1be403bdc679261bef67cf6c04 >> "$state"
fi
# step 3: run sh -ec 'command -v zypper >/dev/null || { echo '\''zypper not found: these packages are for the zypper family'\'' >&2; exit 1; }
if ! grep -qx 6ba998a027f60119ef90300e9dc05646 "$state"; then
  sh -c "sh -ec 'command -v zypper >/dev/null || { echo '\\''zypper not found: these packages are for the zypper family'\\'' >&2; exit 1; }
if "'! { rpm -q --quiet nginx; }; then
  zypper --non-interactive refresh
  zypper --non-interactive install --auto-agree-with-licenses nginx
fi
'"'"
  echo 6ba998a027f60119ef90300e9dc05646 >> "$state"
fi
