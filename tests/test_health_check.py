"""MachineHealthCheck settings are validated, naming the field."""
import pytest

from harness.health import MachineHealthCheck


@pytest.mark.parametrize("kw, field", [({"unhealthy_after": 0}, "unhealthy_after"),
                                       ({"node_startup_timeout": -1}, "node_startup_timeout"),
                                       ({"max_unhealthy": 0}, "max_unhealthy"),
                                       ({"max_unhealthy": 1.5}, "max_unhealthy")])
def test_bad_settings_are_named(kw, field):
    with pytest.raises(ValueError, match=rf"MachineHealthCheck\.{field}: .*allowed"):
        MachineHealthCheck(**kw)


def test_defaults_are_cluster_api_like():
    c = MachineHealthCheck()
    assert c.unhealthy_after == 300 and c.node_startup_timeout == 600 and 0 < c.max_unhealthy < 1
