"""Air-gapped builds: Kubernetes from Go modules, component images, node image."""
