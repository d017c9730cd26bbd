"""Typed identifiers shared by every layer of the engine.

They are ``NewType`` aliases over ``int`` and ``str``: free at run time, checked by mypy.
"""

from __future__ import annotations

from typing import NewType

Index = NewType("Index", int)
"""A Raft log index; the first entry has index 1, 0 means 'none'."""

Term = NewType("Term", int)
"""A Raft term; 0 before any election."""

ServerId = NewType("ServerId", str)
"""A member of one Raft group: ``"<node-name>/<queue-uid>"`` or, in tests, any short name."""

QueueUid = NewType("QueueUid", str)
"""The internal id of a queue; directories are named by it, never by the user-given name."""

NodeName = NewType("NodeName", str)
"""The name of a Quorra process in a cluster."""

__all__ = ["Index", "NodeName", "QueueUid", "ServerId", "Term"]
