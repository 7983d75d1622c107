"""kube-harness: conformance and end-to-end test harness for kubeadm clusters."""
__version__ = "0.1.0"
