"""The harness CNI (harness.kubeadm.cni): the node sync script run locally
against stub ``ip``/``iptables`` commands, and the pure helpers."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from harness.kubeadm import cni

IP_STUB = r"""#!/bin/bash
# stub of iproute2: routes live in $STATE/routes ("dst via gw dev eth0" lines)
R=$STATE/routes; touch "$R"; echo "ip $*" >>"$STATE/calls"
[[ "$1" == "-4" || "$1" == "-6" ]] && shift
case "$1 $2" in
  "route show")
    case "$3" in
      default) echo "default via 172.18.0.1 dev kh-stub-dev0" ;;
      exact) grep "^$4 " "$R" || true ;;
      root) cat "$R"; echo "10.244.0.7 dev veth1234 scope host" ;;
    esac ;;
  "route replace") grep -v "^$3 " "$R" >"$R.n" || true; echo "$3 via $5 dev eth0" >>"$R.n"; mv "$R.n" "$R" ;;
  "route del") grep -v "^$3 " "$R" >"$R.n" || true; mv "$R.n" "$R" ;;
  *) echo "unexpected ip $*" >&2; exit 2 ;;
esac
"""
# iptables / ip6tables: rules appended with -A are found by -C
IPTABLES_STUB = r"""#!/bin/bash
tool=$(basename "$0"); echo "$tool $*" >>"$STATE/calls"
args=" $*"; rule="$tool ${args/ -[AC] / -X }"
case " $* " in
  *" -C "*) grep -qxF -- "$rule" "$STATE/rules" 2>/dev/null ;;
  *" -A "*) echo "$rule" >>"$STATE/rules" ;;
esac
"""
RESTORE_STUB = r"""#!/bin/bash
tool=$(basename "$0"); echo "$tool $*" >>"$STATE/calls"; { echo "# $tool"; cat; } >>"$STATE/restore"
"""


@pytest.fixture
def node(tmp_path):
    if not shutil.which("flock") or not shutil.which("bash"):
        pytest.skip("needs bash and flock")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in (("ip", IP_STUB), ("iptables", IPTABLES_STUB), ("iptables-restore", RESTORE_STUB),
                       ("ip6tables", IPTABLES_STUB), ("ip6tables-restore", RESTORE_STUB)):
        (bin_ / name).write_text(body)
        (bin_ / name).chmod(0o755)
    script = tmp_path / "kh-cni-sync"
    script.write_text(cni.SYNC_SCRIPT)
    script.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "STATE": str(state),
           "KH_CNI_CONFLIST": str(tmp_path / "net.d" / "10-kube-harness.conflist"),
           "KH_CNI_IPAM_DIR": str(tmp_path / "ipam"), "KH_CNI_LOCK": str(tmp_path / "lock")}

    class Node:
        conflist = tmp_path / "net.d" / "10-kube-harness.conflist"
        ipam = tmp_path / "ipam"

        def run(self, name, nodes, cidr="10.244.0.0/16", services=""):
            (state / "calls").write_text("")
            r = subprocess.run([str(script), name, cidr, services], input=cni.node_table(nodes), env=env,
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            return r.stdout

        def routes(self):
            p = state / "routes"
            return sorted(p.read_text().split("\n")) if p.exists() else []

        def calls(self):
            return (state / "calls").read_text().splitlines()

        def restore(self):
            return (state / "restore").read_text()

    return Node()


NODES = [cni.NodeNet("cp", "10.244.0.0/24", "172.18.0.2"), cni.NodeNet("w1", "10.244.1.0/24", "172.18.0.3"),
         cni.NodeNet("w2", "10.244.2.0/24", "172.18.0.4")]


def test_conflist_shape():
    c = cni.conflist("10.244.3.0/24", 1450)
    ptp, portmap = c["plugins"]
    assert ptp["type"] == "ptp" and ptp["mtu"] == 1450 and ptp["ipMasq"] is False
    assert ptp["ipam"]["type"] == "host-local"
    assert ptp["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]
    assert ptp["ipam"]["dataDir"].startswith("/run/")
    assert portmap == {"type": "portmap", "capabilities": {"portMappings": True}}


def test_desired_routes_and_table():
    nodes = NODES + [cni.NodeNet("new", "", "172.18.0.5"), cni.NodeNet("noip", "10.244.9.0/24", "")]
    assert cni.desired_routes("w1", nodes) == [("10.244.0.0/24", "172.18.0.2"), ("10.244.2.0/24", "172.18.0.4")]
    assert "new - 172.18.0.5\n" in cni.node_table(nodes)
    assert "noip 10.244.9.0/24 -\n" in cni.node_table(nodes)


def test_sync_writes_conflist_routes_and_masquerade(node):
    out = node.run("w1", NODES)
    want = cni.conflist("10.244.1.0/24", 1500)  # stub default device has no /sys entry: 1500
    want["plugins"][0]["ipam"]["dataDir"] = str(node.ipam)
    assert json.loads(node.conflist.read_text()) == want
    assert node.routes() == ["", "10.244.0.0/24 via 172.18.0.2 dev eth0", "10.244.2.0/24 via 172.18.0.4 dev eth0"]
    rules = node.restore()
    assert ":KH-CNI-MASQ - [0:0]" in rules
    assert "-A KH-CNI-MASQ -d 10.244.0.0/16" in rules and "-j RETURN" in rules and "-j MASQUERADE" in rules
    assert any("-A POSTROUTING -s 10.244.0.0/16" in c for c in node.calls())
    assert "conflist 10.244.1.0/24" in out and "route 10.244.0.0/24 via 172.18.0.2" in out


def test_sync_is_idempotent(node):
    node.run("w1", NODES)
    before = node.conflist.stat().st_mtime_ns
    out = node.run("w1", NODES)
    assert out == ""
    assert not [c for c in node.calls() if "replace" in c or " del " in c or " -A " in c]
    assert node.conflist.stat().st_mtime_ns == before


def test_sync_follows_changes(node):
    node.run("w1", NODES)
    (node.ipam / cni.NETWORK_NAME).mkdir(parents=True)
    # w2 is gone, cp moved to another address, a new node has no podCIDR yet
    nodes = [cni.NodeNet("cp", "10.244.0.0/24", "172.18.0.12"), cni.NodeNet("w1", "10.244.1.0/24", "172.18.0.3"),
             cni.NodeNet("w3", "", "172.18.0.6")]
    out = node.run("w1", nodes)
    assert node.routes() == ["", "10.244.0.0/24 via 172.18.0.12 dev eth0"]
    assert "route 10.244.2.0/24 removed" in out
    assert not any("10.244.0.7" in c for c in node.calls() if " del " in c)  # per-pod routes stay
    assert (node.ipam / cni.NETWORK_NAME).exists()  # same podCIDR: IPAM state kept
    # our own podCIDR changed: the conflist follows and stale IPAM state goes
    out = node.run("w1", [cni.NodeNet("w1", "10.244.7.0/24", "172.18.0.3")])
    assert "conflist 10.244.7.0/24" in out
    assert not (node.ipam / cni.NETWORK_NAME).exists()


def test_sync_without_own_cidr_only_routes(node):
    out = node.run("w3", NODES + [cni.NodeNet("w3", "", "172.18.0.6")])
    assert not node.conflist.exists()
    assert len([r for r in node.routes() if r]) == 3
    assert "conflist" not in out


def test_agent_script_and_unit():
    assert cni.SYNC_PATH in cni.AGENT_SCRIPT and cni.ENV_PATH in cni.AGENT_SCRIPT
    assert f"ExecStart={cni.AGENT_PATH}" in cni.UNIT
    assert cni.env_file("w1", "10.244.0.0/16") == "NODE_NAME=w1\nCLUSTER_POD_CIDR=10.244.0.0/16\n"
    for script in (cni.SYNC_SCRIPT, cni.AGENT_SCRIPT):
        r = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    for script in (cni.SYNC_SCRIPT, cni.AGENT_SCRIPT):
        assert "@" not in script.replace("@.type", "").replace("\"$@\"", "").replace("{@}", ""), \
            "unreplaced placeholder"


def test_agent_table_parsing(tmp_path):
    """The agent turns kubectl's jsonpath output into kh-cni-sync's table."""
    import re
    awk = re.search(r"table=\$\((awk .*?)<<<", cni.AGENT_SCRIPT).group(1)
    raw = ("cp|10.244.0.0/24,|172.18.0.2,\nw1||172.18.0.3,\nw2|10.244.2.0/24,|\n"
           "w3|10.244.3.0/24,fd00:10:244:3::/64,|172.18.0.5,fd00:1::5,\n")
    r = subprocess.run(["bash", "-c", f"{awk} <<<\"$0\"", raw.rstrip("\n")], capture_output=True, text=True)
    assert r.stdout.splitlines() == ["cp 10.244.0.0/24 172.18.0.2", "w1 - 172.18.0.3", "w2 10.244.2.0/24 -",
                                     "w3 10.244.3.0/24,fd00:10:244:3::/64 172.18.0.5,fd00:1::5"]


DUAL = [cni.NodeNet("cp", "10.244.0.0/24,fd00:10:244::/64", "172.18.0.2,fd00:1::2"),
        cni.NodeNet("w1", "10.244.1.0/24,fd00:10:244:1::/64", "172.18.0.3,fd00:1::3"),
        cni.NodeNet("w2", "10.244.2.0/24,fd00:10:244:2::/64", "172.18.0.4")]  # no IPv6 address yet


def test_dual_stack_conflist_and_routes(node):
    """Both families: one IPAM range and default route each, routes per family
    via the other node's address of that family, masquerade and Service
    rejects in iptables and ip6tables."""
    cidrs, services = "10.244.0.0/16,fd00:10:244::/56", "10.96.0.0/16,fd00:10:96::/112"
    out = node.run("w1", DUAL, cidrs, services)
    want = cni.conflist("10.244.1.0/24,fd00:10:244:1::/64", 1500)
    want["plugins"][0]["ipam"]["dataDir"] = str(node.ipam)
    assert json.loads(node.conflist.read_text()) == want
    ipam = want["plugins"][0]["ipam"]
    assert ipam["ranges"] == [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]
    assert ipam["routes"] == [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
    assert node.routes() == ["", "10.244.0.0/24 via 172.18.0.2 dev eth0", "10.244.2.0/24 via 172.18.0.4 dev eth0",
                             "fd00:10:244::/64 via fd00:1::2 dev eth0"]
    assert "ip -6 route replace fd00:10:244::/64 via fd00:1::2" in node.calls()
    assert cni.desired_routes("w1", DUAL) == [("10.244.0.0/24", "172.18.0.2"), ("10.244.2.0/24", "172.18.0.4"),
                                              ("fd00:10:244::/64", "fd00:1::2")]
    restore = node.restore()
    assert "# ip6tables-restore" in restore and "-A KH-CNI-MASQ -d fd00:10:244::/56" in restore
    for line in ("masquerade 10.244.0.0/16", "masquerade fd00:10:244::/56", "reject unserved 10.96.0.0/16 (FORWARD)",
                 "reject unserved fd00:10:96::/112 (OUTPUT)"):
        assert line in out
    assert any(c.startswith("ip6tables -t nat -A POSTROUTING -s fd00:10:244::/56") for c in node.calls())
    assert node.run("w1", DUAL, cidrs, services) == ""  # idempotent
