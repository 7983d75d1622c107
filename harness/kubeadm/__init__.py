"""kubeadm bootstrap: config generation (config), the Bootstrapper (bootstrap)
and the harness's minimal CNI (cni)."""
