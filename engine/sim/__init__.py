"""engine.sim (see engine/__init__.py for the layering)."""
