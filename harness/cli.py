"""kube-harness: provision, list, delete and reap clusters outside pytest.

  kube-harness build --version v1.37.2 --node-image  # build (or find cached) artifacts: kube, images, e2e, capi, kind
  kube-harness up -c configs/default.yaml [--keep]   # provision (kept: it is yours)
  kube-harness down NAME [-n NAMESPACE]              # delete a cluster
  kube-harness list                                  # clusters and machines
  kube-harness reap                                  # remove leftovers of dead runs
  kube-harness logs -c FILE [--name N] [--dir DIR]   # export machine logs (as `kind export logs`)
  kube-harness validate -c FILE                      # check a spec, create nothing
  kube-harness schema                                # the spec's JSON Schema (configs/schema.json)
  kube-harness capi-init --kubeconfig FILE           # install the Cluster API providers the harness builds
  kube-harness load-image IMAGE... --cluster NAME    # local Docker images into every node (as kind load)
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from providers import registry
from providers.base import L_CLUSTER, L_NAMESPACE, Cleanup, require

from . import artifacts, reaper, schema
from .cluster import Cluster
from .controller import MachineController, NoBootstrap
from .progress import configure, log
from .spec import SpecError, load

#: the packaged default spec (the checkout's configs/, or the installed package's)
DEFAULT_CONFIG = str(Path(__file__).resolve().parent.parent / "configs" / "default.yaml")


def _provider(name: str, options: dict | None = None):
    if name not in registry.names():
        raise SpecError("--provider", name, f"one of {registry.names()}")
    return registry.get(name, options or {})


def _clusters(prov) -> dict[tuple[str, str], list[str]]:
    """Every cluster's objects, by (namespace, name) labels."""
    rows: dict[tuple[str, str], list[str]] = {}
    for o in require(prov, Cleanup, needed_for="finding clusters").list_owned({}):
        lb = o.get("labels") or {}
        rows.setdefault((lb.get(L_NAMESPACE, "?"), lb.get(L_CLUSTER, "?")), []).append(f"{o['kind']}:{o['name']}")
    return rows


def _require_cluster(prov, name: str, namespace: str) -> None:
    """SpecError naming the cluster and the existing ones when it has no objects."""
    have = sorted(f"{ns}/{n}" for ns, n in _clusters(prov))
    if f"{namespace}/{name}" not in have:
        raise SpecError("cluster", f"{namespace}/{name}",
                        f"one of the existing clusters {have}" if have else "an existing cluster (there are none)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kube-harness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build", add_help=False, help="build the artifacts (python -m harness.build; --help for its "
                                                "options)")
    up = sub.add_parser("up", help="provision a cluster from a spec and keep it")
    up.add_argument("-c", "--cluster-config", default=DEFAULT_CONFIG)
    up.add_argument("--bootstrap", choices=("kubeadm", "none"), default="kubeadm")
    up.add_argument("--node-image", default=None)
    down = sub.add_parser("down", help="delete a cluster")
    down.add_argument("name")
    down.add_argument("-n", "--namespace", default="default")
    down.add_argument("--provider", default="docker")
    ls = sub.add_parser("list", help="list clusters")
    ls.add_argument("--provider", default="docker")
    rp = sub.add_parser("reap", help="delete objects of dead runs")
    rp.add_argument("--provider", default="docker")
    lg = sub.add_parser("logs", help="export every machine's logs and a cluster dump")
    lg.add_argument("-c", "--cluster-config", default=DEFAULT_CONFIG)
    lg.add_argument("--name", default=None, help="cluster name (default: the spec's)")
    lg.add_argument("--dir", default=None, help="where (default $ARTIFACTS, else ./_artifacts)")
    va = sub.add_parser("validate", help="validate a spec")
    va.add_argument("-c", "--cluster-config", required=True)
    sub.add_parser("schema", help="print the spec's JSON Schema (for editors; configs/schema.json)")
    ci = sub.add_parser("capi-init", help="install the Cluster API providers the harness builds (core, kubeadm "
                                          "bootstrap and control plane, CAPD) into a cluster, as clusterctl init")
    ci.add_argument("--kubeconfig", required=True, help="the management cluster")
    ci.add_argument("--no-load-images", action="store_true",
                    help="do not put the providers' images into the nodes (the cluster pulls them itself)")
    ci.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="a clusterctl variable")
    li = sub.add_parser("load-image", help="put local Docker images into every node's containerd (as `kind load "
                                           "docker-image`), checked with crictl on each node")
    li.add_argument("images", nargs="+", metavar="IMAGE")
    which = li.add_mutually_exclusive_group(required=True)
    which.add_argument("--cluster", help="a cluster the harness made (see `kube-harness list`)")
    which.add_argument("--kubeconfig", help="any cluster whose nodes the harness reaches (their providerID)")
    li.add_argument("-n", "--namespace", default="default")
    li.add_argument("--provider", default="docker")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build"]:  # the build layer's own command line
        from .build.__main__ import main as build_main
        return build_main(argv[1:], prog="kube-harness build")
    a = p.parse_args(argv)
    if a.cmd == "schema":
        print(json.dumps(schema.json_schema(), indent=2))
        return 0
    configure()
    try:
        if a.cmd == "validate":
            s = load(a.cluster_config)
            from .kubeadm.validate import check_kubeadm_patches
            if not check_kubeadm_patches(s):
                print(f"note: spec.kubeadm not checked: no kubeadm {s.version} on this host yet (`up` checks it "
                      f"after the build)")
            print(f"ok: {s.namespace}/{s.name} {s.version} provider={s.provider} machines={s.machine_count}")
        elif a.cmd == "up":
            spec = load(a.cluster_config)
            from .build.nodeimage import check_option
            from .kubeadm.validate import check_kubeadm_patches
            prov = _provider(spec.provider, spec.provider_options)
            check_option(a.node_image, prov)
            check_kubeadm_patches(spec)
            owner = reaper.current_owner(f"cli-{uuid.uuid4().hex[:8]}", keep=True)
            if a.bootstrap == "kubeadm":
                from .kubeadm.bootstrap import KubeadmBootstrapper
                boot = KubeadmBootstrapper(node_image=a.node_image)
            else:
                boot = NoBootstrap()
            ctl = MachineController(prov, owner, boot)
            cl = ctl.provision(spec, on_failure=lambda c: artifacts.collect(c, reason="up failed"))
            print(f"cluster {cl.namespace}/{cl.name} is up; machines: {[m.name for m in cl.machines()]}")
            if cl.bootstrapped:
                print(f"export KUBECONFIG={cl.kubeconfig_path}")
        elif a.cmd == "down":
            prov = _provider(a.provider)
            _require_cluster(prov, a.name, a.namespace)
            from .capi.cleanup import delete_workloads  # a management cluster's workload clusters first
            delete_workloads(prov, prov.list_machines(a.name, a.namespace))
            deleted = prov.delete_owned({L_CLUSTER: a.name, L_NAMESPACE: a.namespace})
            Cluster.forget(a.name, a.namespace)
            print(f"deleted {len(deleted)} objects: {', '.join(deleted) or '-'}")
        elif a.cmd == "list":
            for (ns, name), objs in sorted(_clusters(_provider(a.provider)).items()):
                print(f"{ns}/{name}: {' '.join(sorted(objs))}")
        elif a.cmd == "logs":
            spec = load(a.cluster_config)
            if a.name:
                spec = spec.with_overrides(name=a.name)
            prov = _provider(spec.provider, spec.provider_options)
            _require_cluster(prov, spec.name, spec.namespace)
            cl = Cluster(spec, prov, reaper.current_owner("cli-logs"))
            print(artifacts.collect(cl, Path(a.dir) if a.dir else None, reason="kube-harness logs"))
        elif a.cmd == "reap":
            deleted = reaper.reap(_provider(a.provider))
            print(f"reaped {len(deleted)} objects")
        elif a.cmd == "load-image":
            _load_image(a)
        elif a.cmd == "capi-init":
            _capi_init(a.kubeconfig, a.var, load=not a.no_load_images)
    except SpecError as e:
        for err in e.errors:
            print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    return 0


def _load_image(a: argparse.Namespace) -> None:
    from .existing import existing_cluster
    from .images_load import ImageLoadError, image_ids, load_images
    for image in a.images:
        try:
            image_ids([image])
        except ImageLoadError:
            raise SpecError("IMAGE", image, "an image in `docker images`") from None
    kubeconfig = a.kubeconfig
    if a.cluster:
        prov = _provider(a.provider)
        _require_cluster(prov, a.cluster, a.namespace)
        kubeconfig = Cluster.state_dir_of(a.cluster, a.namespace) / "kubeconfig"
        if not kubeconfig.is_file():
            raise SpecError("--cluster", a.cluster, "a bootstrapped cluster (it has no kubeconfig)")
    cluster = existing_cluster(kubeconfig, reaper.current_owner("cli-load-image"))
    loaded = load_images(cluster, a.images)
    for machine, tags in sorted(loaded.items()):
        print(f"{machine}: {'loaded ' + ', '.join(tags) if tags else 'had them'}")


def _capi_init(kubeconfig: str, variables: list[str], load: bool) -> None:
    from .build import capi as capi_build
    from .capi.install import install
    from .capi.repository import build_repository
    from .reached import ExistingCluster
    if not Path(kubeconfig).expanduser().is_file():
        raise SpecError("--kubeconfig", kubeconfig, "an existing kubeconfig file")
    bad = [v for v in variables if "=" not in v]
    if bad:
        raise SpecError("--var", bad[0], "NAME=VALUE")
    capi_dir = capi_build.build_capi()
    images = capi_build.build_capi_images(capi_dir)
    repo = build_repository(capi_dir, images)
    target = ExistingCluster(kubeconfig)
    ctl = install(target, repo, capi_dir / "bin" / "clusterctl", sorted(images.values()) if load else [],
                  variables=dict(v.split("=", 1) for v in variables))
    print(f"Cluster API providers installed into {kubeconfig}; clusterctl config: {ctl.config}")


if __name__ == "__main__":
    sys.exit(main())
