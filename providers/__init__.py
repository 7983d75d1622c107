"""Machine providers: capability protocols and a base class (providers.base), many backends."""
