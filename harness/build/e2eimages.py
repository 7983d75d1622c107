"""Local builds of the e2e test images that the conformance tests run.

Nothing is pulled: every image is built on this machine and tagged under a
local registry name (``kube-harness.local`` by default), and the e2e
framework is pointed at those names with a ``KUBE_TEST_REPO_LIST`` file
(see :func:`repo_list`).  Image names and versions come from the
``k8s.io/kubernetes`` module's ``test/utils/image/manifest.go``, so a tag is
exactly what e2e.test asks for, e.g.
``kube-harness.local/e2e-test-images/agnhost:2.56``.

How each image is made:

* agnhost, nonewprivs, sample-apiserver: ``go build`` of the module's
  ``test/images/...`` commands from ``ci/kube-build`` (the same module graph
  as the Kubernetes binaries and e2e.test).
* a "net tools" Debian rootfs (mmdebstrap: curl, netcat-openbsd, iproute2,
  dig, iperf, busybox-static applets for wget/nslookup...) under agnhost,
  jessie-dnsutils, nautilus and kitten, as upstream's alpine agnhost has.
* busybox: the busybox-static Debian package (``apt-get download`` +
  ``dpkg-deb -x``) with every applet symlinked in /bin; /bin/sh runs ash,
  or bash-static when env var names like ``data-1`` (Secret/ConfigMap
  envFrom) must reach ``sh -c env`` (Debian's ash drops them);
  nonroot, nonewprivs and sample-apiserver are built on it.
* nginx / nginx-new: Debian rootfs with nginx-light serving the default
  "Welcome to nginx!" page on :80 from /usr/share/nginx/html.
* httpd / httpd-new: Debian rootfs with apache2-bin laid out like the
  upstream httpd image: /usr/local/apache2/{conf,htdocs}, "It works!" on
  :80, ``httpd-foreground``.
* pause: the module's ``build/pause/linux/pause.c`` compiled static.
* etcd: re-tagged from a local ``registry.k8s.io/etcd:<version>`` image
  (the node image's) when one exists; otherwise it is left out.

Every image carries the label ``harness.k8s.io/input-hash``; a build is
skipped when the tag exists with the same hash.  Rootfs tarballs and
binaries are cached under ``$KUBE_HARNESS_CACHE/e2e-images``.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from . import cache as _cache
from .cache import BuildError, image_labels, tar_add as _tar_add

log = logging.getLogger("harness.build.e2eimages")

ROOT = Path(__file__).resolve().parents[2]
KUBE_BUILD = ROOT / "ci" / "kube-build"
REGISTRY = os.environ.get("KUBE_HARNESS_E2E_REGISTRY", "kube-harness.local")
INPUT_HASH_LABEL = _cache.INPUT_HASH_LABEL
#: bump to rebuild every image
RECIPE_VERSION = "1"
DEBIAN_SUITE = os.environ.get("KUBE_HARNESS_DEBIAN_SUITE", "bookworm")
DEBIAN_MIRROR = os.environ.get("KUBE_HARNESS_DEBIAN_MIRROR", "http://deb.debian.org/debian")

#: the images the [Conformance] specs run (ImageID names from manifest.go); those a release's
#: manifest does not have are left out (v1.37 replaced JessieDnsutils and Httpd, and runs
#: StatefulSets on AgnhostPrev)
CONFORMANCE_IMAGES = (
    "Agnhost", "AgnhostPrev", "BusyBox", "Pause", "JessieDnsutils", "GlibcDnsTesting", "Nginx", "NginxNew",
    "Httpd", "HttpdNew", "Nautilus", "Kitten", "NonRoot", "Nonewprivs", "APIServer", "Etcd",
)
#: enough for the smoke subset
SMOKE_IMAGES = ("Agnhost", "BusyBox", "Pause", "JessieDnsutils", "GlibcDnsTesting", "Httpd", "HttpdNew", "Nginx",
                "NginxNew")

#: registry keys that must keep their upstream (unreachable) value: tests
#: expect pulls from them to fail, or they need credentials we do not have
_KEEP_UPSTREAM = ("invalidRegistry", "privateRegistry", "gcAuthenticatedRegistry")


# --------------------------------------------------------------- manifest

@dataclass(frozen=True)
class ImageRef:
    """One ``configs[ID] = Config{list.X, name, version}`` of manifest.go."""
    id: str
    registry_key: str  # yaml key, e.g. promoterE2eRegistry
    name: str
    version: str
    upstream_registry: str

    @property
    def upstream(self) -> str:
        return f"{self.upstream_registry}/{self.name}:{self.version}"

    def local(self, registry: str = REGISTRY) -> str:
        return f"{repo_list(registry)[self.registry_key]}/{self.name}:{self.version}"


def cache_dir() -> Path:
    d = _cache.cache_dir() / "e2e-images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _run(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None, input: bytes | None = None,
         timeout: float | None = None, quiet: bool = False) -> str:
    log.debug("run: " + " ".join(cmd))
    p = subprocess.run(cmd, cwd=cwd, env=env, input=input, capture_output=True, timeout=timeout)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).decode(errors="replace")[-4000:]
        raise BuildError(f"{' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''} exited {p.returncode}:\n{tail}")
    return p.stdout.decode(errors="replace")


def _gomod_version() -> str:
    m = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", (KUBE_BUILD / "go.mod").read_text(), re.M)
    if not m:
        raise BuildError(f"{KUBE_BUILD / 'go.mod'}: no k8s.io/kubernetes requirement")
    return m.group(1)


def module_dir(version: str | None = None) -> Path:
    """The k8s.io/kubernetes module source (manifest.go, test/images files) in
    the module cache, downloaded through the Go module proxy if missing.
    Go commands are always built from ci/kube-build's module graph."""
    pinned = _gomod_version()
    if not version or version == pinned:
        cmd = ["go", "list", "-m", "-json", "k8s.io/kubernetes"]
    else:
        log.warning(f"e2e images for {version}: names from its manifest.go, Go commands from ci/kube-build "
                    f"({pinned})")
        cmd = ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"]
    d = json.loads(_run(cmd, cwd=KUBE_BUILD)).get("Dir")
    if not d and cmd[1] == "list":
        _run(["go", "mod", "download", "k8s.io/kubernetes"], cwd=KUBE_BUILD)
        d = json.loads(_run(cmd, cwd=KUBE_BUILD)).get("Dir")
    if not d:
        raise BuildError("cannot locate the k8s.io/kubernetes module source")
    return Path(d)


def parse_manifest(text: str) -> dict[str, ImageRef]:
    """ImageID name -> ImageRef, from the text of manifest.go."""
    fields = dict(re.findall(r"^\s*(\w+)\s+string\s+`yaml:\"(\w+)\"`", text, re.M))
    init_block = re.search(r"initRegistry\s*=\s*RegistryList\{(.*?)\n\t\}", text, re.S)
    defaults = dict(re.findall(r"(\w+):\s*\"([^\"]+)\"", init_block.group(1))) if init_block else {}
    refs = {}
    for ident, field, name, version in re.findall(
            r"configs\[(\w+)\]\s*=\s*Config\{list\.(\w+),\s*\"([^\"]+)\",\s*\"([^\"]+)\"\}", text):
        key = fields.get(field, field[:1].lower() + field[1:])
        refs[ident] = ImageRef(ident, key, name, version, defaults.get(field, ""))
    if "Agnhost" not in refs:
        raise BuildError("manifest.go: no image configs found (format changed?)")
    return refs


def manifest(version: str | None = None) -> dict[str, ImageRef]:
    return parse_manifest((module_dir(version) / "test/utils/image/manifest.go").read_text())


def repo_list(registry: str = REGISTRY) -> dict[str, str]:
    """The KUBE_TEST_REPO_LIST content: every registry key e2e.test knows,
    mapped under ``registry`` (except the ones that must stay unreachable)."""
    m = {
        "promoterE2eRegistry": f"{registry}/e2e-test-images",
        "buildImageRegistry": f"{registry}/build-image",
        "gcEtcdRegistry": registry,
        "gcRegistry": registry,
        "sigStorageRegistry": f"{registry}/sig-storage",
        "dockerLibraryRegistry": f"{registry}/library",
        "cloudProviderGcpRegistry": f"{registry}/cloud-provider-gcp",
        "invalidRegistry": "invalid.registry.k8s.io/invalid",
        "privateRegistry": "gcr.io/k8s-authenticated-test",
        "gcAuthenticatedRegistry": "gcr.io/authenticated-image-pulling",
    }
    return m


def write_repo_list(path: Path | str | None = None, registry: str = REGISTRY) -> Path:
    import yaml
    p = Path(path) if path else cache_dir() / f"repo-list-{registry}.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    body = "# KUBE_TEST_REPO_LIST for e2e.test: images built locally by harness/build/e2eimages.py\n"
    body += yaml.safe_dump(repo_list(registry), sort_keys=True)
    if not p.exists() or p.read_text() != body:
        p.write_text(body)
    return p


# ----------------------------------------------------------------- docker

def image_hash(tag: str) -> str | None:
    labels = image_labels(tag)
    return None if labels is None else labels.get(INPUT_HASH_LABEL, "")


def docker_import(tar: Path, tag: str, labels: dict[str, str], changes: Iterable[str] = ()) -> None:
    cmd = ["docker", "import"]
    for c in changes:
        cmd += ["--change", c]
    for k, v in labels.items():
        cmd += ["--change", f"LABEL {k}={json.dumps(v)}"]
    with _cache.replacing(tag):
        _run(cmd + [str(tar), tag], timeout=1800)


def docker_build(tag: str, dockerfile: str, files: dict[str, bytes | Path | tuple[bytes | Path, int]],
                 labels: dict[str, str]) -> None:
    """``docker build`` (classic builder: FROM a local image never pulls)."""
    with tempfile.TemporaryDirectory(prefix="kh-e2eimg-") as d:
        ctx = Path(d)
        (ctx / "Dockerfile").write_text(dockerfile)
        for name, src in files.items():
            mode = None
            if isinstance(src, tuple):
                src, mode = src
            dst = ctx / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(src, Path):
                shutil.copyfile(src, dst)
            else:
                dst.write_bytes(src)
            os.chmod(dst, mode if mode is not None else 0o644)
        cmd = ["docker", "build", "--pull=false", "-q", "-t", tag]
        for k, v in labels.items():
            cmd += ["--label", f"{k}={v}"]
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        with _cache.replacing(tag):
            _run(cmd + [str(ctx)], env=env, timeout=1800)


# ------------------------------------------------------------------ build

def _h(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode() if not isinstance(p, bytes) else p)
        h.update(b"\0")
    return h.hexdigest()


def _src(fn: Callable) -> str:
    return inspect.getsource(fn)


def _lock(name: str):
    return _cache.lock(f"e2eimages-{name}")


def _tar_dir(root: Path, out: Path) -> None:
    tmp = out.with_suffix(".tmp")
    _run(["tar", "--numeric-owner", "--sort=name", "--xattrs", "-C", str(root), "-cf", str(tmp), "."],
         timeout=1800)
    tmp.rename(out)


def _write(root: Path, rel: str, data: str | bytes, mode: int = 0o644) -> None:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or p.exists():
        p.unlink()
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    os.chmod(p, mode)


def _symlink(root: Path, rel: str, target: str) -> None:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_symlink() or p.exists():
        p.unlink()
    p.symlink_to(target)


def _exists_in(root: Path, name: str) -> bool:
    for d in ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"):
        p = root / d / name
        if p.is_symlink() or p.exists():
            return True
    return False


def _busybox_links(root: Path, busybox: str, dest: str = "usr/local/bin") -> None:
    """Symlink every busybox applet the rootfs does not already have."""
    host_bb = root / busybox.lstrip("/")
    applets = _run([str(host_bb), "--list"]).split()
    for a in applets:
        if a in ("busybox", "init", "linuxrc") or _exists_in(root, a):
            continue
        _symlink(root, f"{dest}/{a}", busybox)


# rootfs post-processing (the source of each function is part of its hash)

def _post_net(root: Path) -> None:
    _busybox_links(root, "/bin/busybox")
    _symlink(root, "usr/local/bin/iperf", "/usr/bin/iperf")
    # the user and group upstream's agnhost image defines
    with open(root / "etc/passwd", "a") as f:
        f.write("user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n")
    with open(root / "etc/group", "a") as f:
        f.write("user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n")
    (root / "home/user-defined-in-image").mkdir(parents=True, exist_ok=True)
    os.chown(root / "home/user-defined-in-image", 1000, 1000)
    (root / "uploads").mkdir(exist_ok=True)
    _drop_perl(root)


_NGINX_INDEX = """<!DOCTYPE html>
<html>
<head>
<title>Welcome to nginx!</title>
</head>
<body>
<h1>Welcome to nginx!</h1>
<p>If you see this page, the nginx web server is successfully installed and
working. Further configuration is required.</p>
<p><em>Thank you for using nginx.</em></p>
</body>
</html>
"""


def _post_nginx(root: Path) -> None:
    for p in (root / "etc/nginx/sites-enabled").glob("*"):
        p.unlink()
    _write(root, "etc/nginx/conf.d/default.conf", """server {
    listen       80;
    server_name  localhost;
    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }
    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
""")
    _write(root, "usr/share/nginx/html/index.html", _NGINX_INDEX)
    _write(root, "usr/share/nginx/html/50x.html",
           "<html><head><title>Error</title></head><body><h1>An error occurred.</h1></body></html>\n")
    _symlink(root, "var/log/nginx/access.log", "/dev/stdout")
    _symlink(root, "var/log/nginx/error.log", "/dev/stderr")
    _drop_perl(root)


_HTTPD_CONF = """ServerRoot "/usr/local/apache2"
Listen 80
LoadModule mpm_event_module /usr/lib/apache2/modules/mod_mpm_event.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
LoadModule authz_host_module /usr/lib/apache2/modules/mod_authz_host.so
LoadModule mime_module /usr/lib/apache2/modules/mod_mime.so
LoadModule dir_module /usr/lib/apache2/modules/mod_dir.so
LoadModule alias_module /usr/lib/apache2/modules/mod_alias.so
LoadModule headers_module /usr/lib/apache2/modules/mod_headers.so
User daemon
Group daemon
ServerName localhost
ServerAdmin you@example.com
DocumentRoot "/usr/local/apache2/htdocs"
<Directory />
    AllowOverride none
    Require all denied
</Directory>
<Directory "/usr/local/apache2/htdocs">
    Options FollowSymLinks
    AllowOverride None
    Require all granted
</Directory>
DirectoryIndex index.html
<Files ".ht*">
    Require all denied
</Files>
ErrorLog /proc/self/fd/2
LogLevel warn
LogFormat "%h %l %u %t \\"%r\\" %>s %b" common
CustomLog /proc/self/fd/1 common
TypesConfig conf/mime.types
PidFile logs/httpd.pid
"""


def _post_httpd(root: Path) -> None:
    _write(root, "usr/local/apache2/conf/httpd.conf", _HTTPD_CONF)
    _write(root, "usr/local/apache2/conf/mime.types",
           "text/html html htm\ntext/plain txt\ntext/css css\napplication/json json\n"
           "application/javascript js\nimage/jpeg jpeg jpg\nimage/png png\n")
    _write(root, "usr/local/apache2/htdocs/index.html", "<html><body><h1>It works!</h1></body></html>\n")
    (root / "usr/local/apache2/logs").mkdir(parents=True, exist_ok=True)
    _symlink(root, "usr/local/apache2/bin/httpd", "/usr/sbin/apache2")
    _write(root, "usr/local/bin/httpd-foreground", "#!/bin/sh\nset -e\n"
           "rm -f /usr/local/apache2/logs/httpd.pid\n"
           "exec /usr/sbin/apache2 -DFOREGROUND -f /usr/local/apache2/conf/httpd.conf \"$@\"\n", 0o755)
    _drop_perl(root)


def _drop_perl(root: Path) -> None:
    """perl (not perl-base) only comes in through package dependencies; the
    images never run it."""
    for rel in ("usr/share/perl", "usr/lib/x86_64-linux-gnu/perl", "usr/share/perl5"):
        shutil.rmtree(root / rel, ignore_errors=True)
    for p in (root / "usr/lib/x86_64-linux-gnu").glob("libperl.so*"):
        p.unlink()


@dataclass(frozen=True)
class Rootfs:
    name: str
    packages: tuple[str, ...]
    post: Callable[[Path], None]

    def key(self) -> str:
        return _h("rootfs", RECIPE_VERSION, DEBIAN_SUITE, DEBIAN_MIRROR, self.packages, _src(self.post),
                  _src(_busybox_links), _src(_drop_perl))


ROOTFS = {
    "net": Rootfs("net", ("busybox-static", "curl", "netcat-openbsd", "iproute2", "bind9-dnsutils", "iperf",
                          "iputils-ping", "procps"), _post_net),
    "nginx": Rootfs("nginx", ("nginx-light",), _post_nginx),
    "httpd": Rootfs("httpd", ("apache2-bin",), _post_httpd),
}

_DPKG_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                  "/usr/share/lintian/*")


class Builder:
    """Builds (or finds cached) images for one Kubernetes version."""

    def __init__(self, version: str | None = None, registry: str = REGISTRY, force: bool = False):
        self.version = version or _gomod_version()
        self.registry = registry
        self.force = force
        self._mod: Path | None = None
        self._refs: dict[str, ImageRef] | None = None
        self.built: dict[str, str] = {}  # id -> tag
        self.hashes: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self.skipped: dict[str, str] = {}
        self._go_inputs: str | None = None

    @property
    def mod(self) -> Path:
        if self._mod is None:
            self._mod = module_dir(self.version)
        return self._mod

    @property
    def refs(self) -> dict[str, ImageRef]:
        if self._refs is None:
            self._refs = parse_manifest((self.mod / "test/utils/image/manifest.go").read_text())
        return self._refs

    def tag(self, ident: str) -> str:
        return self.refs[ident].local(self.registry)

    # -- inputs
    def rootfs(self, spec: Rootfs) -> Path:
        """A cached rootfs tarball (mmdebstrap, variant essential)."""
        out = cache_dir() / "rootfs" / f"{spec.name}-{spec.key()[:16]}.tar"
        if out.exists() and not self.force:
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        with _lock(f"rootfs-{spec.name}"):
            if out.exists() and not self.force:
                return out
            t0 = time.monotonic()
            log.info(f"mmdebstrap {DEBIAN_SUITE} rootfs {spec.name}: {' '.join(spec.packages)}")
            with tempfile.TemporaryDirectory(prefix=f"kh-rootfs-{spec.name}-", dir=out.parent) as d:
                root = Path(d) / "root"
                cmd = ["mmdebstrap", "--variant=essential", "--mode=root", "--format=directory",
                       "--include=" + ",".join(spec.packages),
                       "--aptopt=Acquire::Retries \"3\""]
                cmd += [f"--dpkgopt=path-exclude={p}" for p in _DPKG_EXCLUDES]
                cmd += [DEBIAN_SUITE, str(root), DEBIAN_MIRROR]
                _run(cmd, timeout=1800)
                spec.post(root)
                _tar_dir(root, out)
            self.timings[f"rootfs:{spec.name}"] = round(time.monotonic() - t0, 1)
            log.info(f"rootfs {spec.name}: {out.stat().st_size >> 20} MiB in {time.monotonic() - t0:.0f}s")
        return out

    def go_inputs(self) -> str:
        if self._go_inputs is None:
            gover = _run(["go", "env", "GOVERSION"]).strip()
            self._go_inputs = _h((KUBE_BUILD / "go.mod").read_bytes(), (KUBE_BUILD / "go.sum").read_bytes(), gover)
        return self._go_inputs

    def go_binary(self, pkg: str, name: str) -> Path:
        key = _h("go", pkg, self.go_inputs())[:16]
        out = cache_dir() / "bin" / f"{name}-{key}"
        if out.exists() and not self.force:
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        with _lock(f"go-{name}"):
            if out.exists() and not self.force:
                return out
            t0 = time.monotonic()
            log.info(f"go build {pkg}")
            env = {**os.environ, "CGO_ENABLED": "0"}
            tmp = out.with_suffix(".tmp")
            _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), pkg], cwd=KUBE_BUILD, env=env,
                 timeout=3600)
            tmp.rename(out)
            self.timings[f"go:{name}"] = round(time.monotonic() - t0, 1)
            log.info(f"go build {name}: {time.monotonic() - t0:.0f}s")
        return out

    def deb(self, package: str) -> Path:
        """A Debian package file (``apt-get download``, cached)."""
        d = cache_dir() / "debs"
        d.mkdir(parents=True, exist_ok=True)
        found = sorted(d.glob(f"{package}_*.deb"))
        if found and not self.force:
            return found[-1]
        with _lock(f"deb-{package}"):
            for attempt in (1, 2):
                try:
                    _run(["apt-get", "download", "-q", package], cwd=d, timeout=600)
                    break
                except BuildError:
                    if attempt == 2:
                        raise
                    log.info("apt-get download failed; apt-get update and retry")
                    _run(["apt-get", "update", "-q"], timeout=600)
        return sorted(d.glob(f"{package}_*.deb"))[-1]

    # -- images
    def ensure(self, ident: str) -> str | None:
        """Build ``ident`` (a manifest ImageID name) unless cached; returns its
        tag, or None when it cannot be made here."""
        if ident in self.built:
            return self.built[ident]
        if ident in self.skipped:
            return None
        recipe = RECIPES.get(ident)
        if recipe is None:
            self.skipped[ident] = "no local recipe"
            return None
        tag = self.tag(ident)
        t0 = time.monotonic()
        try:
            made = recipe(self, ident, tag)
        except BuildError as e:
            log.error(f"{ident} ({tag}): {e}")
            raise
        if made is None:
            return None
        self.built[ident] = tag
        self.timings.setdefault(f"image:{ident}", round(time.monotonic() - t0, 1))
        return tag

    def fresh(self, tag: str, h: str) -> bool:
        if self.force:
            return False
        return image_hash(tag) == h

    def labels(self, h: str, ident: str) -> dict[str, str]:
        ref = self.refs.get(ident)
        out = {INPUT_HASH_LABEL: h, "harness.k8s.io/e2e-image": ident}
        if ref:
            out["harness.k8s.io/upstream"] = ref.upstream
        return out

    def base(self, spec: Rootfs) -> tuple[str, str]:
        """A local base image imported from a cached rootfs: (tag, hash)."""
        h = _h("base", spec.key())
        tag = f"{self.registry}/e2e-base/{spec.name}:{h[:12]}"
        if not self.fresh(tag, h):
            tar = self.rootfs(spec)
            with _lock(f"image-base-{spec.name}"):
                if not self.fresh(tag, h):
                    docker_import(tar, tag, {INPUT_HASH_LABEL: h},
                                  ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
                    _untag_others(tag)
        return tag, h

    def from_dockerfile(self, ident: str, tag: str, h: str, dockerfile: str, files: dict | None = None) -> str:
        self.hashes[ident] = h
        if self.fresh(tag, h):
            log.info(f"{tag}: up to date")
            return tag
        with _lock(f"image-{ident}"):
            if not self.fresh(tag, h):
                t0 = time.monotonic()
                docker_build(tag, dockerfile, files or {}, self.labels(h, ident))
                log.info(f"built {tag} in {time.monotonic() - t0:.1f}s")
        return tag

    def build(self, idents: Iterable[str] = CONFORMANCE_IMAGES) -> dict[str, str]:
        """Build the images this release's manifest has; returns ImageID -> local tag for those made."""
        idents = [i for i in idents if i in self.refs]
        for ident in idents:
            self.ensure(ident)
        for ident, why in self.skipped.items():
            log.warning(f"e2e image {ident} not built: {why}")
        return {i: self.built[i] for i in idents if i in self.built}


# ----------------------------------------------------------------- recipes

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


_PASSWD = """root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
bin:x:2:2:bin:/bin:/bin/false
sys:x:3:3:sys:/dev:/bin/false
sync:x:4:100:sync:/bin:/bin/sync
mail:x:8:8:mail:/var/spool/mail:/bin/false
www-data:x:33:33:www-data:/var/www:/bin/false
operator:x:37:37:Operator:/var:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
"""
_GROUP = """root:x:0:
daemon:x:1:
bin:x:2:
sys:x:3:
adm:x:4:
tty:x:5:
disk:x:6:
wheel:x:10:root
mail:x:12:
www-data:x:33:
operator:x:37:
users:x:100:
nogroup:x:65534:
"""


def _busybox_rootfs(deb: Path, out: Path, bash_deb: Path) -> None:
    """busybox applets in /bin; /bin/sh is a small static program
    (``ci/busybox-sh/sh.c``) that runs busybox ash, as upstream's image does,
    or bash-static when the environment holds names that are not shell
    identifiers (e.g. ``data-1`` from a Secret/ConfigMap envFrom, which the
    conformance specs print with ``sh -c env``): Debian's ash drops those,
    upstream's passes them on."""
    with tempfile.TemporaryDirectory(prefix="kh-busybox-") as d:
        _run(["dpkg-deb", "-x", str(deb), d])
        _run(["dpkg-deb", "-x", str(bash_deb), d + "/bash"])
        bb = next(p for p in (Path(d) / "bin/busybox", Path(d) / "usr/bin/busybox") if p.exists())
        bash = next(p for p in (Path(d, "bash/bin/bash-static"), Path(d, "bash/usr/bin/bash-static"))
                    if p.exists())
        applets = sorted(set(_run([str(bb), "--list"]).split()) - {"busybox", "linuxrc", "sh", "bash"})
        tmp = out.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tf:
            for dname, mode in (("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("home", 0o755),
                                ("proc", 0o555), ("root", 0o700), ("sys", 0o555), ("tmp", 0o1777),
                                ("usr", 0o755), ("usr/bin", 0o755), ("usr/sbin", 0o755), ("sbin", 0o755),
                                ("var", 0o755), ("var/spool", 0o755), ("var/spool/mail", 0o755),
                                ("var/www", 0o755)):
                _tar_add(tf, dname, dir=True, mode=mode)
            _tar_add(tf, "bin/busybox", data=bb.read_bytes(), mode=0o755)
            _tar_add(tf, "bin/bash", data=bash.read_bytes(), mode=0o755)
            _tar_add(tf, "bin/sh", data=_compile_static(BUSYBOX_SH, Path(d) / "sh"), mode=0o755)
            for a in applets:
                _tar_add(tf, f"bin/{a}", link="busybox")
            _tar_add(tf, "etc/passwd", data=_PASSWD.encode())
            _tar_add(tf, "etc/group", data=_GROUP.encode())
            _tar_add(tf, "etc/shadow", data=b"root:*:10933:0:99999:7:::\n", mode=0o640)
            _tar_add(tf, "etc/hostname", data=b"busybox\n")
            _tar_add(tf, "etc/nsswitch.conf", data=b"hosts: files dns\nnetworks: files\n")
        tmp.rename(out)


BUSYBOX_SH = ROOT / "ci" / "busybox-sh" / "sh.c"


def _compile_static(src: Path, out: Path) -> bytes:
    _run(["gcc", "-Os", "-Wall", "-static", "-o", str(out), str(src)])
    return out.read_bytes()


def _r_busybox(b: Builder, ident: str, tag: str) -> str:
    deb, bash = b.deb("busybox-static"), b.deb("bash-static")
    h = _h(RECIPE_VERSION, ident, tag, deb.name, bash.name, _src(_busybox_rootfs), BUSYBOX_SH.read_text(),
           _PASSWD, _GROUP)
    if b.fresh(tag, h):
        log.info(f"{tag}: up to date")
        b.hashes[ident] = h
        return tag
    with _lock(f"image-{ident}"):
        if not b.fresh(tag, h):
            out = cache_dir() / "rootfs" / f"busybox-{h[:16]}.tar"
            out.parent.mkdir(parents=True, exist_ok=True)
            if not out.exists():
                _busybox_rootfs(deb, out, bash)
            docker_import(out, tag, b.labels(h, ident), [
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["sh"]'])
            log.info(f"built {tag}")
    b.hashes[ident] = h
    return tag


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
    b.hashes[ident] = h
    if b.fresh(tag, h):
        log.info(f"{tag}: up to date")
        return tag
    with _lock(f"image-{ident}"), tempfile.TemporaryDirectory(prefix="kh-pause-") as d:
        binp = Path(d) / "pause"
        _run(["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION=v{version}", "-o", str(binp), str(src)])
        _run(["strip", str(binp)])
        tar = Path(d) / "rootfs.tar"
        with tarfile.open(tar, "w") as tf:
            _tar_add(tf, "pause", data=binp.read_bytes(), mode=0o755)
        docker_import(tar, tag, b.labels(h, ident), ["USER 65535:65535", 'ENTRYPOINT ["/pause"]'])
        log.info(f"built {tag}")
    return tag


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
    local = _run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", f"{ref.upstream_registry}/etcd"])
    candidates = sorted((x for x in local.split() if not x.endswith(":<none>")), reverse=True)
    for src in (os.environ.get("KUBE_HARNESS_ETCD_IMAGE", ""), ref.upstream, *candidates):
        if src and image_labels(src) is not None:
            if image_labels(tag) is None or _image_id(tag) != _image_id(src):
                _run(["docker", "tag", src, tag])
            return tag
    if image_labels(tag) is not None:
        return tag
    b.skipped[ident] = (f"no local {ref.upstream} image to re-tag (the aggregator conformance test, which "
                        f"runs etcd next to the sample-apiserver, will fail)")
    return None


def _untag_others(tag: str) -> None:
    """Drop older tags of a base image (their children keep the layers)."""
    repo = tag.rsplit(":", 1)[0]
    for other in _run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repo]).split():
        if other != tag:
            subprocess.run(["docker", "rmi", other], capture_output=True)


def _image_id(tag: str) -> str:
    return _run(["docker", "image", "inspect", "-f", "{{.Id}}", tag]).strip()


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


def build_e2e_images(version: str | None = None, images: Iterable[str] = CONFORMANCE_IMAGES, *,
                     registry: str = REGISTRY, force: bool = False) -> dict[str, str]:
    """Build (or reuse) the e2e images; returns ImageID -> local tag."""
    b = Builder(version, registry, force)
    t0 = time.monotonic()
    out = b.build(tuple(images))
    log.info(f"e2e images ready in {time.monotonic() - t0:.1f}s: {', '.join(sorted(out.values()))}")
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(prog="python -m harness.build.e2eimages", description=__doc__.split("\n")[0])
    ap.add_argument("--version", default=None, help="k8s.io/kubernetes version (default: ci/kube-build's)")
    ap.add_argument("--images", default="conformance",
                    help="conformance, smoke or a comma separated list of manifest ImageIDs")
    ap.add_argument("--registry", default=REGISTRY)
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--repo-list", default=None, help="also write the KUBE_TEST_REPO_LIST file here")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ids = {"conformance": CONFORMANCE_IMAGES, "smoke": SMOKE_IMAGES}.get(a.images) or \
        tuple(x.strip() for x in a.images.split(",") if x.strip())
    tags = build_e2e_images(a.version, ids, registry=a.registry, force=a.force)
    p = write_repo_list(a.repo_list, a.registry)
    print(json.dumps({"images": tags, "repo_list": str(p)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
