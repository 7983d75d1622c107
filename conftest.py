"""Top-level conftest: the harness plugin itself is loaded through its
pytest11 entry point (pip install -e .); fall back to loading it here when
running from a checkout that was not installed."""
import importlib.util

if importlib.util.find_spec("harness") is not None:
    try:
        from importlib.metadata import entry_points
        _installed = any(ep.name == "kube_harness" for ep in entry_points(group="pytest11"))
    except Exception:
        _installed = False
    if not _installed:
        pytest_plugins = ["harness.plugin"]
