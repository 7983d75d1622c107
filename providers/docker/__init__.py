"""Docker provider: machines are privileged systemd containers (kind / CAPD style)."""
from .provider import DockerProvider, ExecTimeout, haproxy_config, lb_name, network_name, volume_name

__all__ = ["DockerProvider", "ExecTimeout", "haproxy_config", "lb_name", "network_name", "volume_name"]
