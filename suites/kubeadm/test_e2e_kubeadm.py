"""kubeadm's own e2e suite (k8s.io/kubernetes/test/e2e_kubeadm) against the
session's cluster: one pytest result per spec, Prow JUnit in
$ARTIFACTS/junit_e2e_kubeadm.xml, the log in $ARTIFACTS/e2e_kubeadm/."""
from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from harness.e2e_kubeadm import COPY_CERTS, join_skips, run_e2e_kubeadm
from harness.progress import log

pytestmark = [pytest.mark.cluster]


def _uploaded_certs_skip(cluster, config) -> str:
    """Skip the [copy-certs] specs on a cluster the harness did not make with
    ``kubeadm init --upload-certs`` (Cluster API's KubeadmControlPlane copies
    certificates itself; a given cluster may not upload them) when it has no
    kubeadm-certs Secret. In direct mode they always run."""
    if not (config.getoption("cluster_api") or config.getoption("kubeconfig")):
        return ""
    try:
        cluster.core.read_namespaced_secret("kubeadm-certs", "kube-system")
        return ""
    except ApiException as e:
        if e.status != 404:
            raise
    log.info("no kube-system/kubeadm-certs Secret (control planes not joined with uploaded certificates): "
             f"skipping {COPY_CERTS}")
    return COPY_CERTS


def test_e2e_kubeadm(cluster, request):
    cfg = request.config
    skip = join_skips(cfg.getoption("e2e_kubeadm_skip"), _uploaded_certs_skip(cluster, cfg))
    run = run_e2e_kubeadm(cluster, focus=cfg.getoption("e2e_kubeadm_focus"), skip=skip,
                          binary=cfg.getoption("e2e_kubeadm_binary"))
    request.node._kh_e2e_specs = ("e2e_kubeadm", run.results)  # the plugin reports each spec
    for k, v in run.timings.items():
        request.node.user_properties.append((f"seconds.{k}", v))
    ran = [r for r in run.results if r.node_type == "It"]
    assert ran, f"no e2e_kubeadm spec ran; see {run.phase.log_path}"
    if cluster.spec.ip_family == "dual" and not cfg.getoption("e2e_kubeadm_focus"):
        dual = [r for r in ran if "dual-stack" in r.name]
        assert dual and all(r.outcome != "skipped" for r in dual), \
            f"e2e_kubeadm's dual-stack specs must run on a dual-stack cluster: {[(r.name, r.outcome) for r in dual]}"
    if run.failed or run.phase.error:
        lines = [f"{run.summary()}{'; ' + run.phase.error if run.phase.error else ''}"]
        lines += [f"  - {r.name}: {r.message.splitlines()[0][:300] if r.message else r.state}" for r in run.failed]
        lines.append(f"log: {run.phase.log_path}")
        pytest.fail("\n".join(lines), pytrace=False)
