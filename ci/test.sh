#!/usr/bin/env bash
# The README's test command. Three pytest runs, each with its own Prow JUnit:
#   1. the harness's own tests (real Docker engine, bare machines, builds)
#   2. the real-cluster suites sharing one session cluster: kubeadm, the
#      conformance smoke subset, Cluster API management mode
#   3. lifecycle (scale, repair, faults, upgrade) on clusters of their own
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
cluster_suites=(suites/kubeadm)
[ -d suites/conformance ] && cluster_suites+=(suites/conformance --conformance-smoke)
[ -n "$(ls suites/capi/test_*.py 2>/dev/null)" ] && cluster_suites+=(suites/capi)
step cluster "${cluster_suites[@]}" "$@"
step lifecycle suites/lifecycle "$@"
exit $rc
