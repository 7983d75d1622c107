#!/usr/bin/env bash
# The README's test command. Five pytest runs, each with its own Prow JUnit:
#   1. the harness's own tests (real Docker engine, bare machines, builds)
#   2. the real-cluster suites sharing one session cluster (direct mode):
#      kubeadm (with kubeadm's own e2e_kubeadm suite), the conformance smoke subset
#   2b. the same on a dual-stack cluster (configs/dualstack.yaml): IPv4 and IPv6
#      pods, Services and routes, e2e_kubeadm's dual-stack spec
#   3. lifecycle (scale, repair, faults, upgrade) on clusters of their own
#   4. Cluster API mode: the same kubeadm, smoke and lifecycle (scale, replace)
#      suites on clusters the real controllers make, and suites/capi, sharing
#      one management cluster
# Extra arguments go to every pytest run. Exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export ARTIFACTS="${ARTIFACTS:-$PWD/_artifacts}"
mkdir -p "$ARTIFACTS"
rc=0
step() {
  local name=$1; shift
  echo "=== $name: pytest $*" >&2
  local t0=$SECONDS
  python3 -m pytest -p no:cacheprovider --junitxml="$ARTIFACTS/junit_$name.xml" "$@"
  local r=$?
  echo "=== $name: exit $r after $((SECONDS - t0))s" >&2
  [ $r -eq 0 ] || rc=$r
}
step harness tests "$@"
step cluster suites/kubeadm suites/conformance --conformance-smoke "$@"
step dualstack --cluster-config configs/dualstack.yaml suites/kubeadm suites/conformance --conformance-smoke "$@"
step lifecycle suites/lifecycle "$@"
step cluster_api --cluster-api --cluster-config configs/capi.yaml suites/kubeadm suites/conformance \
  --conformance-smoke suites/lifecycle/test_scale_repair.py suites/capi "$@"
exit $rc
