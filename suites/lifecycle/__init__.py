"""Lifecycle suite (a package: its shared cluster is torn down after its last test)."""
