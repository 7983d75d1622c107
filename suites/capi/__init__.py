"""suites/capi as a package, so that pytest --pyargs suites.capi finds it installed."""
