"""Docker provider: machines are privileged systemd containers (kind / CAPD style)."""
from .engine import EngineUnavailable, ExecTimeout
from .loadbalancer import haproxy_config, lb_name
from .machine_config import volume_name
from .network import network_name
from .provider import DockerProvider

__all__ = ["DockerProvider", "EngineUnavailable", "ExecTimeout", "haproxy_config", "lb_name", "network_name",
           "volume_name"]
