#!/usr/bin/env bash
# Prepare a fresh Debian machine: Docker engine, mmdebstrap, Go, the Python
# package, then build (or take from cache) Kubernetes and the node image.
# Idempotent: a second run only checks.
#   bash ci/setup.sh        what the main job needs (Kubernetes, node image)
#   bash ci/setup.sh --all  also e2e.test for the conformance suite and the older
#                           version the upgrade test starts from (what ci/test.sh runs)
# Env: KUBE_HARNESS_SKIP_BUILD=1 skips the build, KUBE_HARNESS_VERSION=vX.Y.Z,
# KUBE_HARNESS_E2E=1 builds e2e.test, KUBE_HARNESS_UPGRADE_FROM=vX.Y.Z the upgrade-from version.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  --all) export KUBE_HARNESS_E2E=1 KUBE_HARNESS_UPGRADE_FROM="${KUBE_HARNESS_UPGRADE_FROM:-v1.33.13}" ;;
  "") ;;
  *) echo "usage: bash ci/setup.sh [--all]" >&2; exit 2 ;;
esac
log() { echo "setup [$(date +%T)] $*" >&2; }

need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v mmdebstrap >/dev/null || need_apt+=(mmdebstrap)
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
command -v git >/dev/null || need_apt+=(git)
[ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || need_apt+=(debian-archive-keyring)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd"
  if [ -f /var/run/docker.pid ] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
    rm -f /var/run/docker.pid
  fi
  mkdir -p /var/log
  nohup dockerd >/var/log/kube-harness-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -50 /var/log/kube-harness-dockerd.log >&2; log "dockerd did not start"; exit 1; }
fi
log "docker $(docker version --format '{{.Server.Version}}') storage=$(docker info --format '{{.Driver}}') cgroup=$(docker info --format '{{.CgroupVersion}}')"

# every node's kubelet and containerd need inotify instances (HA clusters exhaust the default 128)
sysctl -q -w fs.inotify.max_user_instances=8192 fs.inotify.max_user_watches=524288 || log "warning: could not raise inotify limits"

if ! command -v go >/dev/null; then
  log "installing Go from Debian (newer toolchains come from the Go module proxy via GOTOOLCHAIN)"
  apt-get install -y -q golang-go >/dev/null
  export GOTOOLCHAIN=auto
fi

if ! python3 -c "import harness.plugin, providers.docker" 2>/dev/null || [ pyproject.toml -nt .kube-harness-installed ]; then
  log "pip install -e .[test]"
  python3 -m pip install -q -e '.[test]'
  touch .kube-harness-installed
fi

if [ "${KUBE_HARNESS_SKIP_BUILD:-0}" != 1 ]; then
  args=(--version "${KUBE_HARNESS_VERSION:-v1.34.4}" --node-image)
  [ "${KUBE_HARNESS_E2E:-0}" = 1 ] && args+=(--e2e)
  log "building Kubernetes artifacts and node image (cached by version)"
  python3 -m harness.build "${args[@]}"
  if [ -n "${KUBE_HARNESS_UPGRADE_FROM:-}" ]; then
    log "building the upgrade-from version ${KUBE_HARNESS_UPGRADE_FROM}"
    python3 -m harness.build --version "$KUBE_HARNESS_UPGRADE_FROM" --node-image
  fi
fi
log "ready"
