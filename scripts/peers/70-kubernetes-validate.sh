#!/usr/bin/env bash
# kubernetes-validate (PyPI), which checks manifests, CustomResourceDefinitions included,
# against the OpenAPI schemas of real Kubernetes versions: machine-kube's CRD test runs it
# on the committed CRD (no kube-apiserver can be installed here). In a virtualenv under
# ${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/kubernetes-validate.
# Idempotent: a venv that already has the pinned version is left alone.
set -euo pipefail

venv="${XDG_CACHE_HOME:-$HOME/.cache}/machine-provisioning/kubernetes-validate"
version=1.37.0

installed_version() {
  "$venv/bin/python" -c "import importlib.metadata as m; print(m.version('kubernetes-validate'))" 2>/dev/null || true
}

if [ -x "$venv/bin/kubernetes-validate" ] && [ "$(installed_version)" = "$version" ]; then
  echo "kubernetes-validate already installed in $venv ($version)"
  exit 0
fi

# Debian's python3 needs python3-venv for `python3 -m venv` to bring pip along.
if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update
  apt-get -o DPkg::Lock::Timeout=300 install -y python3 python3-venv
fi

mkdir -p "$(dirname "$venv")"
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$version"
echo "kubernetes-validate installed in $venv ($(installed_version))"
