"""The kube-harness suites, shipped with the package: ``pytest --pyargs suites.kubeadm``
(or suites.conformance, suites.lifecycle, suites.capi) runs one from the installed package."""
