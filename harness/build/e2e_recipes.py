"""How each e2e test image is made (:data:`RECIPES`, manifest ImageID ->
recipe): a recipe gets the :class:`~harness.build.e2eimages.Builder`, the
ImageID and the local tag, computes the image's input hash and lets the
builder build it unless an image with that hash exists.

* agnhost, nonewprivs, sample-apiserver: ``go build`` of the module's
  ``test/images/...`` commands from the kube-build module;
* jessie-dnsutils, nautilus, kitten, nginx, httpd: on the rootfs of
  :mod:`.e2e_rootfs`; busybox: its own rootfs, nonroot, nonewprivs and
  sample-apiserver on it;
* pause: the module's ``build/pause/linux/pause.c`` compiled static;
* etcd: re-tagged from a local ``registry.k8s.io/etcd:<version>`` image
  (the node image's) when one exists; otherwise it is left out."""
from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .cache import digest as _h, docker_import, image_hash, image_id, image_labels, image_tags, run as _run
from .e2e_manifest import cache_dir
from .e2e_rootfs import (BUSYBOX_SH, RECIPE_VERSION, ROOTFS, _GROUP, _PASSWD, _busybox_rootfs, _src,
                         _tar_add)

if TYPE_CHECKING:  # pragma: no cover
    from .e2eimages import Builder


def _r_agnhost(b: Builder, ident: str, tag: str) -> str:
    base, bh = b.base(ROOTFS["net"])
    binary = b.go_binary("k8s.io/kubernetes/test/images/agnhost", "agnhost")
    porter = b.mod / "test/images/agnhost/porter"
    df = f"""FROM {base}
COPY agnhost /agnhost
COPY localhost.crt /localhost.crt
COPY localhost.key /localhost.key
RUN ln -s agnhost /agnhost-2
EXPOSE 80 8080 8081 9376 5000
ENTRYPOINT ["/agnhost"]
CMD ["pause"]
"""
    h = _h(RECIPE_VERSION, ident, tag, bh, df, b.go_inputs())
    return b.from_dockerfile(ident, tag, h, df, {
        "agnhost": (binary, 0o755), "localhost.crt": porter / "localhost.crt",
        "localhost.key": porter / "localhost.key"})


def _r_dnsutils(b: Builder, ident: str, tag: str) -> str:
    """Debian (glibc) with dig and getent: JessieDnsutils, GlibcDnsTesting."""
    base, bh = b.base(ROOTFS["net"])
    df = f'FROM {base}\nCMD ["bash"]\n'
    return b.from_dockerfile(ident, tag, _h(RECIPE_VERSION, ident, tag, bh, df), df)


def _r_webserver_data(name: str) -> Callable[[Builder, str, str], str | None]:
    def recipe(b: Builder, ident: str, tag: str) -> str | None:
        agn = b.ensure("Agnhost")
        html = b.mod / f"test/images/{name}/html"
        df = f'FROM {agn}\nCOPY {name}.jpg /{name}.jpg\nCOPY data.json /data.json\nCMD ["test-webserver"]\n'
        h = _h(RECIPE_VERSION, ident, tag, b.hashes.get("Agnhost") or image_hash(agn), df,
               (html / f"{name}.jpg").read_bytes(), (html / "data.json").read_bytes())
        return b.from_dockerfile(ident, tag, h, df, {f"{name}.jpg": html / f"{name}.jpg",
                                                     "data.json": html / "data.json"})
    return recipe


def _r_busybox(b: Builder, ident: str, tag: str) -> str:
    deb, bash = b.deb("busybox-static"), b.deb("bash-static")
    h = _h(RECIPE_VERSION, ident, tag, deb.name, bash.name, _src(_busybox_rootfs), BUSYBOX_SH.read_text(),
           _PASSWD, _GROUP)

    def make() -> None:
        out = cache_dir() / "rootfs" / f"busybox-{h[:16]}.tar"
        out.parent.mkdir(parents=True, exist_ok=True)
        if not out.exists():
            _busybox_rootfs(deb, out, bash)
        docker_import(out, tag, h, ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                    'CMD ["sh"]'], labels=b.labels(ident))
    return b.image(ident, tag, h, make)


def _r_on_busybox(extra: str, files: Callable[[Builder], dict] | None = None) -> Callable:
    def recipe(b: Builder, ident: str, tag: str) -> str | None:
        bb = b.ensure("BusyBox")
        fs = files(b) if files else {}
        df = f"FROM {bb}\n{extra}"
        h = _h(RECIPE_VERSION, ident, tag, b.hashes.get("BusyBox") or image_hash(bb), df,
               {k: _h(v[0].read_bytes() if isinstance(v, tuple) else v.read_bytes()) for k, v in fs.items()})
        return b.from_dockerfile(ident, tag, h, df, fs)
    return recipe


def _nnp_files(b: Builder) -> dict:
    return {"nnp": (b.go_binary("k8s.io/kubernetes/test/images/nonewprivs", "nnp"), 0o4755)}


def _sample_apiserver_files(b: Builder) -> dict:
    return {"sample-apiserver": (b.go_binary("k8s.io/sample-apiserver", "sample-apiserver"), 0o755)}


def _r_pause(b: Builder, ident: str, tag: str) -> str:
    src = b.mod / "build/pause/linux/pause.c"
    version = b.refs[ident].version
    gcc = _run(["gcc", "--version"]).splitlines()[0]
    h = _h(RECIPE_VERSION, ident, tag, src.read_bytes(), gcc)

    def make() -> None:
        with tempfile.TemporaryDirectory(prefix="kh-pause-") as d:
            binp = Path(d) / "pause"
            _run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{version}", "-o", str(binp), str(src)])
            _run(["strip", str(binp)])
            tar = Path(d) / "rootfs.tar"
            with tarfile.open(tar, "w") as tf:
                _tar_add(tf, "pause", data=binp.read_bytes(), mode=0o755)
            docker_import(tar, tag, h, ["USER 65535:65535", 'ENTRYPOINT ["/pause"]'], labels=b.labels(ident))
    return b.image(ident, tag, h, make)


def _r_rootfs_image(rootfs: str, changes: str) -> Callable:
    def recipe(b: Builder, ident: str, tag: str) -> str:
        base, bh = b.base(ROOTFS[rootfs])
        # the label makes "-new" variants distinct images (own image ID)
        df = f"FROM {base}\n{changes}LABEL harness.k8s.io/variant={b.refs[ident].name}-{b.refs[ident].version}\n"
        return b.from_dockerfile(ident, tag, _h(RECIPE_VERSION, ident, tag, bh, df), df)
    return recipe


def _r_etcd(b: Builder, ident: str, tag: str) -> str | None:
    """etcd comes from the node image's build (kubeadm runs it): re-tag."""
    ref = b.refs[ident]
    candidates = sorted((x for x in image_tags(f"{ref.upstream_registry}/etcd") if not x.endswith(":<none>")),
                        reverse=True)
    for src in (os.environ.get("KUBE_HARNESS_ETCD_IMAGE", ""), ref.upstream, *candidates):
        if src and image_labels(src) is not None:
            if image_id(tag) != image_id(src):
                _run(["docker", "tag", src, tag], what=f"tag {tag}")
            return tag
    if image_labels(tag) is not None:
        return tag
    b.skipped[ident] = (f"no local {ref.upstream} image to re-tag (the aggregator conformance test, which "
                        f"runs etcd next to the sample-apiserver, will fail)")
    return None


RECIPES: dict[str, Callable[[Builder, str, str], str | None]] = {
    "Agnhost": _r_agnhost,
    "AgnhostPrev": _r_agnhost,  # the same agnhost under the previous tag (rollouts change the image)
    "JessieDnsutils": _r_dnsutils,
    "GlibcDnsTesting": _r_dnsutils,
    "Nautilus": _r_webserver_data("nautilus"),
    "Kitten": _r_webserver_data("kitten"),
    "BusyBox": _r_busybox,
    "NonRoot": _r_on_busybox("USER 1234\n"),
    "Nonewprivs": _r_on_busybox('COPY nnp /usr/local/bin/nnp\nRUN chmod 4755 /usr/local/bin/nnp\nCMD ["nnp"]\n',
                                _nnp_files),
    "APIServer": _r_on_busybox('COPY sample-apiserver /sample-apiserver\nENTRYPOINT ["/sample-apiserver"]\n',
                               _sample_apiserver_files),
    "Pause": _r_pause,
    "Nginx": _r_rootfs_image("nginx", 'EXPOSE 80\nSTOPSIGNAL SIGQUIT\nCMD ["nginx", "-g", "daemon off;"]\n'),
    "NginxNew": _r_rootfs_image("nginx", 'EXPOSE 80\nSTOPSIGNAL SIGQUIT\nCMD ["nginx", "-g", "daemon off;"]\n'),
    "Httpd": _r_rootfs_image("httpd", 'ENV PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:'
                                      '/usr/sbin:/usr/bin:/sbin:/bin\nWORKDIR /usr/local/apache2\nEXPOSE 80\n'
                                      'STOPSIGNAL SIGWINCH\nCMD ["httpd-foreground"]\n'),
    "HttpdNew": _r_rootfs_image("httpd", 'ENV PATH=/usr/local/apache2/bin:/usr/local/sbin:/usr/local/bin:'
                                         '/usr/sbin:/usr/bin:/sbin:/bin\nWORKDIR /usr/local/apache2\nEXPOSE 80\n'
                                         'STOPSIGNAL SIGWINCH\nCMD ["httpd-foreground"]\n'),
    "Etcd": _r_etcd,
}
