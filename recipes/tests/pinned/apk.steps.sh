#!/bin/sh
# machine-core step layer "base": 3 steps
set -eu
state=/var/lib/machine-core/layers/base.done
mkdir -p "$(dirname "$state")"
touch "$state"
# step 1: run sh -ec 'f=/etc/apk/repositories
if ! grep -qx 8c3fd32d1cfe0194d4b26b148e9b4ef9 "$state"; then
  sh -c "sh -ec 'f=/etc/apk/repositories
l=https://dl.example.invalid/alpine/v3.20/main
mkdir -p /etc/apk
[ -e \""'$f" ] || : > "$f"
if ! grep -qxF -- "$l" "$f"; then
  if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then echo >> "$f"; fi
  printf '"'\\''%s\\n'\\'' \""'$l" >> "$f"
fi
'"'"
  echo 8c3fd32d1cfe0194d4b26b148e9b4ef9 >> "$state"
fi
# step 2: write /etc/apk/keys/example-5d5f2a7e.rsa.pub
if ! grep -qx 562361d8dd158765ad0e77e8a8e2f8aa "$state"; then
  mkdir -p "$(dirname /etc/apk/keys/example-5d5f2a7e.rsa.pub)"
  printf '%s' 'LS0tLS1CRUdJTiBQVUJMSUMgS0VZLS0tLS0KTUlJQklqQU5CZ2txaGtpRzl3MEJBUUVGQUFPQ0FROEFNSUlCQ2dLQ0FRRUFleGFtcGxlCi0tLS0tRU5EIFBVQkxJQyBLRVktLS0tLQo=' | base64 -d > /etc/apk/keys/example-5d5f2a7e.rsa.pub.machine-core-tmp
  chmod 644 /etc/apk/keys/example-5d5f2a7e.rsa.pub.machine-core-tmp
  mv -f /etc/apk/keys/example-5d5f2a7e.rsa.pub.machine-core-tmp /etc/apk/keys/example-5d5f2a7e.rsa.pub
  echo 562361d8dd158765ad0e77e8a8e2f8aa >> "$state"
fi
# step 3: run sh -ec 'command -v apk >/dev/null || { echo '\''apk not found: these packages are for the apk family'\'' >&2; exit 1; }
if ! grep -qx 612f652ba3a8e6e15b36fc700f359d4c "$state"; then
  sh -c "sh -ec 'command -v apk >/dev/null || { echo '\\''apk not found: these packages are for the apk family'\\'' >&2; exit 1; }
if "'! { apk info -e -v curl 2>/dev/null | grep -qxF curl-8.9.1-r1; }; then
  apk --quiet update
  apk --quiet add curl=8.9.1-r1
fi
'"'"
  echo 612f652ba3a8e6e15b36fc700f359d4c >> "$state"
fi
