"""The locally built e2e busybox image behaves as upstream's where the
conformance specs look: ash's messages, and env var names that are not shell
identifiers (envFrom keys) passed on to ``sh -c env``."""
import docker
import pytest

from harness.build import e2eimages

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def busybox():
    return e2eimages.build_e2e_images(images=["BusyBox"])["BusyBox"]


def run(image: str, cmd: list[str], **kw) -> str:
    return docker.from_env().containers.run(image, cmd, remove=True, stderr=True, **kw).decode()


def test_read_only_rootfs_message_is_ash_s(busybox):
    # [sig-node] Kubelet ... read only busybox container should not write to root filesystem
    out = run(busybox, ["/bin/sh", "-c", "echo test > /file; true"], read_only=True)
    assert out == "/bin/sh: can't create /file: Read-only file system\n"


def test_env_names_that_are_not_identifiers_reach_env(busybox):
    # [sig-node] ConfigMap/Secrets should be consumable via the environment (envFrom)
    out = run(busybox, ["sh", "-c", "env"], environment={"data-1": "value-1", "$_-data-1": "x", "OK": "y"})
    assert {"data-1=value-1", "$_-data-1=x", "OK=y"} <= set(out.split())
