"""engine.runtime (see engine/__init__.py for the layering)."""
