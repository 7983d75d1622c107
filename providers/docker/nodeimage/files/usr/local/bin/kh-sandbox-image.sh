#!/bin/sh
# Set the CRI sandbox (pause) image containerd uses, e.g.
#   kh-sandbox-image.sh registry.k8s.io/pause:3.10
# Run at image build time, or on a machine followed by a containerd restart.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 IMAGE" >&2; exit 2; }
sed -i -E "s|^([[:space:]]*sandbox_image[[:space:]]*=[[:space:]]*).*|\1\"$1\"|" /etc/containerd/config.toml
grep -q "sandbox_image = \"$1\"" /etc/containerd/config.toml
