"""Cluster API mode.

The real providers (core, kubeadm bootstrap, KubeadmControlPlane, CAPD),
built from the Go module proxy (:mod:`harness.build.capi`), or a provider
author's own, drive the clusters:

* :mod:`.repository` - a local clusterctl repository of the built providers;
* :mod:`.install` - ``clusterctl init`` into a management cluster;
* :mod:`.certificates` - webhook certificates in place of cert-manager;
* :mod:`.clusterctl` - the clusterctl runner;
* :mod:`.management` - the management cluster of a session: the harness's
  own (built providers) or a user's (by kubeconfig);
* :mod:`.workload` - a workload cluster from a cluster template;
* :mod:`.machines` - a workload cluster's machines, seen through its
  Machine objects and reached through the infrastructure's provider;
* :mod:`.controller` - provision, scale, replace and delete workload
  clusters (the ``cluster`` fixture's Cluster API mode);
* :mod:`.capd` - the images CAPD starts (node, load balancer).
"""
