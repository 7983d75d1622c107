#!/bin/sh
# cgroup v2 only: create /sys/fs/cgroup/kubelet with every controller enabled.
# Must run after systemd started (the root cgroup must have no processes
# before its subtree_control can be written), so the kubelet unit runs it.
set -eu
[ -f /sys/fs/cgroup/cgroup.controllers ] || { echo "not a cgroup v2 host" >&2; exit 1; }
enable_all() {
  sed -e 's/ / +/g' -e 's/^/+/' <"/sys/fs/cgroup/$1/cgroup.controllers" >"/sys/fs/cgroup/$1/cgroup.subtree_control"
}
enable_all /
mkdir -p /sys/fs/cgroup/kubelet
enable_all /kubelet
