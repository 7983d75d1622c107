#!/usr/bin/env bash
# The README's test command: the harness's own tests (real Docker engine),
# then the real-cluster kubeadm suite. Exit non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
export ARTIFACTS="${ARTIFACTS:-$PWD/_artifacts}"
rc=0
python3 -m pytest tests -p no:cacheprovider --junitxml="$ARTIFACTS/junit_harness.xml" "$@" || rc=$?
python3 -m pytest suites/kubeadm -p no:cacheprovider --junitxml="$ARTIFACTS/junit_kubeadm.xml" "$@" || rc=$((rc ? rc : $?))
exit $rc
