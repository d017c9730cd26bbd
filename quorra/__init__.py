"""Quorra's Python client: ``quorra.client`` (REST and streams, sync and async)."""
