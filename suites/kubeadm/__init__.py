"""suites/kubeadm as a package, so that pytest --pyargs suites.kubeadm finds it installed."""
