"""Lifecycle tests mutate their cluster, so they get one of their own
(named <spec>-lc), made from --cluster-config and torn down after the module."""
from __future__ import annotations

import pytest

from harness.cluster_factory import ClusterFactory


@pytest.fixture(scope="module")
def lc_factory(request):
    f = ClusterFactory(request.config, request)
    before = request.session.testsfailed
    try:
        yield f
    finally:
        f.finish(request.session.testsfailed > before)


@pytest.fixture(scope="module")
def lc_cluster(lc_factory, cluster_spec):
    return lc_factory(cluster_spec, name=f"{cluster_spec.name}-lc"[:40])


@pytest.fixture(scope="module")
def lc_controller(lc_factory, lc_cluster):
    return lc_factory.controller(lc_cluster)
