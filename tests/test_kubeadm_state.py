"""The kubeadm bootstrap state (kubeadm.json): one typed record, loaded and saved in one place."""
from __future__ import annotations

import json
from types import SimpleNamespace

from harness.kubeadm.actions.context import BootstrapState


def test_state_round_trip_keeps_the_file_format(tmp_path):
    cluster = SimpleNamespace(state_dir=tmp_path)
    assert BootstrapState.load(cluster) is None
    st = BootstrapState(control_plane_endpoint="kh-lb:6443", token="abcdef.0123456789abcdef",
                        certificate_key="k" * 64, certs_uploaded=12.5, ca_cert_hashes=["sha256:00"],
                        cert_sans=["kh-lb", "127.0.0.1"], cgroup_root="/kubelet", cgroup_v1=True,
                        init_machine="kh-control-plane-a", load_balancer="kh-lb")
    st.save(cluster)
    doc = json.loads((tmp_path / "kubeadm.json").read_text())
    assert doc["controlPlaneEndpoint"] == "kh-lb:6443" and doc["certSANs"] == ["kh-lb", "127.0.0.1"]
    assert doc["initMachine"] == "kh-control-plane-a" and doc["cgroupV1"] is True
    assert (tmp_path / "kubeadm.json").stat().st_mode & 0o777 == 0o600
    assert BootstrapState.load(cluster) == st


def test_state_written_by_an_older_harness_loads(tmp_path):
    (tmp_path / "kubeadm.json").write_text(json.dumps(
        {"controlPlaneEndpoint": "cp:6443", "token": "t.t", "certificateKey": "k", "certsUploaded": 1,
         "caCertHashes": ["sha256:1"], "certSANs": [], "cgroupRoot": None, "cgroupV1": False,
         "initMachine": "cp", "loadBalancer": None}))
    st = BootstrapState.load(SimpleNamespace(state_dir=tmp_path))
    assert st is not None and st.token == "t.t" and st.load_balancer is None and st.certs_uploaded == 1.0
    (tmp_path / "kubeadm.json").write_text("{}")
    assert BootstrapState.load(SimpleNamespace(state_dir=tmp_path)) is None
