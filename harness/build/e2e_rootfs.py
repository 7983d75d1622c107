"""The root filesystems under the e2e test images, made from Debian packages:
a "net tools" rootfs (curl, netcat, iproute2, dig, iperf, busybox applets...)
under agnhost, jessie-dnsutils, nautilus and kitten; nginx and httpd laid out
like their upstream images (mmdebstrap, then a post-processing function); and
the busybox rootfs (Debian's busybox-static, /bin/sh from
``sources/busybox-sh/sh.c``). Their tarballs are cached under
``$KUBE_HARNESS_CACHE/e2e-images/rootfs``.

The source text of the post-processing functions and of
:func:`_busybox_rootfs` is part of the image hashes (:func:`_src`): keep it,
and the module names it calls (``_run``, ``_tar_add``...), as they are, or
every e2e image is rebuilt."""
from __future__ import annotations

import inspect
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cache import digest as _h, run as _run, source, tar_add as _tar_add

#: bump to rebuild every image
RECIPE_VERSION = "1"
DEBIAN_SUITE = os.environ.get("KUBE_HARNESS_DEBIAN_SUITE", "bookworm")
DEBIAN_MIRROR = os.environ.get("KUBE_HARNESS_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def _src(fn: Callable) -> str:
    return inspect.getsource(fn)


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


def make_rootfs(spec: Rootfs, out: Path) -> None:
    """mmdebstrap (variant essential) ``spec``'s packages, post-process, tar into ``out``."""
    with tempfile.TemporaryDirectory(prefix=f"kh-rootfs-{spec.name}-", dir=out.parent) as d:
        root = Path(d) / "root"
        cmd = ["mmdebstrap", "--variant=essential", "--mode=root", "--format=directory",
               "--include=" + ",".join(spec.packages),
               "--aptopt=Acquire::Retries \"3\""]
        cmd += [f"--dpkgopt=path-exclude={p}" for p in _DPKG_EXCLUDES]
        cmd += [DEBIAN_SUITE, str(root), DEBIAN_MIRROR]
        _run(cmd, timeout=1800, what=f"mmdebstrap {spec.name}")
        spec.post(root)
        _run(["tar", "--numeric-owner", "--sort=name", "--xattrs", "-C", str(root), "-cf", str(out), "."],
             timeout=1800, what=f"tar {spec.name}")


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


BUSYBOX_SH = source("busybox-sh") / "sh.c"


def _compile_static(src: Path, out: Path) -> bytes:
    _run(["gcc", "-Os", "-Wall", "-static", "-o", str(out), str(src)])
    return out.read_bytes()
