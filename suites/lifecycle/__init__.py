"""suites/lifecycle as a package, so that pytest --pyargs suites.lifecycle finds it installed."""
