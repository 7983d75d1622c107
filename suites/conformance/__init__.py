"""suites/conformance as a package, so that pytest --pyargs suites.conformance finds it installed."""
