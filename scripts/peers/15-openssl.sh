#!/usr/bin/env bash
# The `openssl` command line tool: provider-http's TLS tests make a CA and a server
# certificate with it and serve them with `openssl s_server`, an independent TLS peer.
set -euo pipefail
if command -v openssl >/dev/null; then
  echo "openssl: $(openssl version)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq openssl >/dev/null
echo "openssl: $(openssl version)"
