#!/bin/sh
# Set the CRI sandbox (pause) image containerd pins, e.g.
#   kh-sandbox-image.sh registry.k8s.io/pause:3.10.2
# Run at image build time, or on a machine followed by a containerd restart.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 IMAGE" >&2; exit 2; }
sed -i -E "s|^([[:space:]]*sandbox[[:space:]]*=[[:space:]]*).*|\1\"$1\"|" /etc/containerd/config.toml
grep -q "sandbox = \"$1\"" /etc/containerd/config.toml
