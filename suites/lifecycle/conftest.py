"""Lifecycle tests mutate their cluster, so they get one of their own
(named <spec>-lc), made from --cluster-config, shared by the suite's modules
(each leaves it as it found it: scaled back, machines restarted) and torn
down after the suite. The HA and upgrade tests make clusters of their own."""
from __future__ import annotations

import pytest

from harness.plugin import ClusterFactory


@pytest.fixture(scope="package")
def lc_factory(request):
    f = ClusterFactory(request.config, request)
    before = request.session.testsfailed
    try:
        yield f
    finally:
        f.finish(request.session.testsfailed > before)


@pytest.fixture(scope="package")
def lc_cluster(lc_factory, cluster_spec):
    return lc_factory(cluster_spec, name=f"{cluster_spec.name}-lc"[:40])


@pytest.fixture(scope="package")
def lc_controller(lc_factory, lc_cluster):
    return lc_factory.controller(lc_cluster)
