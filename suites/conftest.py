"""Every suite's session writes $ARTIFACTS/metadata.json at its end (the
controller, not xdist workers): see harness/metadata.py."""
from harness import metadata


def pytest_configure(config):
    metadata.register(config)
