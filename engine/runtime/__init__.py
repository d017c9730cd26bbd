"""engine.runtime: the asyncio shell that hosts queues on a node (see engine/__init__.py).

``Node`` implements ``engine.runtime.api.QueueEngine``; ``InMemoryNetwork`` joins several
nodes of one process (tests), behind the ``Transport`` protocol a TCP transport will
implement.
"""

from engine.runtime.api import QueueEngine
from engine.runtime.node import Node
from engine.runtime.transport import InMemoryNetwork, LocalTransport, Transport

__all__ = ["InMemoryNetwork", "LocalTransport", "Node", "QueueEngine", "Transport"]
