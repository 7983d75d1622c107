#!/usr/bin/env bash
# Prepare a fresh Debian machine: Docker engine, mmdebstrap, Go, the Python
# package, then build (or take from cache) Kubernetes, the node image and
# e2e_kubeadm.test (the kubeadm suite runs it).
# Idempotent: a second run only checks.
#   bash ci/setup.sh        what the main job needs (Kubernetes, node image)
#   bash ci/setup.sh --all  also e2e.test for the conformance suite and the older
#                           version the upgrade test starts from (what ci/test.sh runs), and the
#                           upstream Cluster API controllers (harness/build/sources/capi-build) with the version
#                           their workload clusters run (configs/capi.yaml), and kind (tests/test_kind_compat.py)
# Env: KUBE_HARNESS_SKIP_BUILD=1 skips the build, KUBE_HARNESS_VERSION=vX.Y.Z (default:
# harness/versions.py's), KUBE_HARNESS_E2E=1 builds e2e.test, KUBE_HARNESS_CAPI=1 the Cluster API
# controllers, KUBE_HARNESS_KIND=1 the kind CLI, KUBE_HARNESS_UPGRADE_FROM=vX.Y.Z the upgrade-from
# version (--all: the previous minor of harness/versions.py).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  --all) export KUBE_HARNESS_E2E=1 KUBE_HARNESS_CAPI=1 KUBE_HARNESS_KIND=1 KUBE_HARNESS_UPGRADE_FROM="${KUBE_HARNESS_UPGRADE_FROM:-previous}" ;;
  "") ;;
  *) echo "usage: bash ci/setup.sh [--all]" >&2; exit 2 ;;
esac
. ci/lib.sh

# mmdebstrap builds rootfs tarballs; gcc/libc6-dev pause and runc; libseccomp-dev and
# pkg-config runc's seccomp support; shellcheck the CI files' scripts (tests/test_ci_files.py)
apt_install mmdebstrap gcc libc6-dev git libseccomp-dev pkg-config debian-archive-keyring shellcheck

# Docker Engine >= 23 (older ones refuse --privileged on this kind of host)
bash ci/engine.sh

# every node's kubelet and containerd need inotify instances (HA clusters exhaust the default 128)
sysctl -q -w fs.inotify.max_user_instances=8192 fs.inotify.max_user_watches=524288 || log "warning: could not raise inotify limits"

if ! command -v go >/dev/null; then
  log "installing Go from Debian (newer toolchains come from the Go module proxy via GOTOOLCHAIN)"
  apt-get install -y -q golang-go >/dev/null
  export GOTOOLCHAIN=auto
fi

if ! python3 -c "import harness.plugin, providers.docker" 2>/dev/null || [ pyproject.toml -nt .kube-harness-installed ]; then
  # the distribution was called kube-e2e-harness before: one install of the harness, under its name
  if python3 -m pip show -q kube-e2e-harness >/dev/null 2>&1; then python3 -m pip uninstall -q -y kube-e2e-harness; fi
  log "pip install -e .[test]"
  python3 -m pip install -q -e '.[test]'
  touch .kube-harness-installed
fi

if [ "${KUBE_HARNESS_SKIP_BUILD:-0}" != 1 ]; then
  version() { python3 -c "from harness import versions; print(versions.$1)"; }
  [ "${KUBE_HARNESS_UPGRADE_FROM:-}" = previous ] && KUBE_HARNESS_UPGRADE_FROM=$(version PREVIOUS_VERSION)
  args=(--version "${KUBE_HARNESS_VERSION:-$(version DEFAULT_VERSION)}" --node-image --e2e-kubeadm)
  [ "${KUBE_HARNESS_E2E:-0}" = 1 ] && args+=(--e2e)
  [ "${KUBE_HARNESS_CAPI:-0}" = 1 ] && args+=(--capi)
  [ "${KUBE_HARNESS_KIND:-0}" = 1 ] && args+=(--kind)
  log "building Kubernetes artifacts and node image (cached by version)"
  python3 -m harness.build "${args[@]}"
  if [ -n "${KUBE_HARNESS_UPGRADE_FROM:-}" ]; then
    log "building the upgrade-from version ${KUBE_HARNESS_UPGRADE_FROM}"
    python3 -m harness.build --version "$KUBE_HARNESS_UPGRADE_FROM" --node-image
  fi
  if [ "${KUBE_HARNESS_CAPI:-0}" = 1 ]; then
    capi_version=$(python3 -c "from harness.spec import load; print(load('configs/capi.yaml').version)")
    capi_args=(--version "$capi_version" --node-image --e2e-kubeadm)
    [ "${KUBE_HARNESS_E2E:-0}" = 1 ] && capi_args+=(--e2e)
    log "building the Cluster API mode's version ${capi_version} (configs/capi.yaml)"
    python3 -m harness.build "${capi_args[@]}"
  fi
fi
log "ready"
