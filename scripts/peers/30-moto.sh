#!/usr/bin/env bash
# moto's EC2 server (PyPI moto[server]) for provider-aws's tests, and boto3 for its
# benchmark, in a virtualenv under ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/moto.
# Idempotent: a venv that already has both is left alone.
set -euo pipefail

venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/moto"
moto_version=5.2.5

if [ -x "$venv/bin/moto_server" ] &&
  "$venv/bin/python" -c "import boto3, moto; assert moto.__version__ == '$moto_version'" 2>/dev/null; then
  echo "moto already installed in $venv ($("$venv/bin/python" -c 'import moto; print(moto.__version__)'))"
  exit 0
fi

# Debian's python3 needs python3-venv for `python3 -m venv` to bring pip along.
if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update
  apt-get install -y python3 python3-venv
fi

mkdir -p "$(dirname "$venv")"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$moto_version" boto3
echo "moto installed in $venv ($("$venv/bin/python" -c 'import moto; print(moto.__version__)'))"
