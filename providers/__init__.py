"""Machine providers: one interface (providers.base.MachineProvider), many backends."""
