"""Quorra's queue engine.

Layers, with dependencies pointing one way only:

- ``engine.raft``    sans-IO Raft core: events in, one ``Ready`` value out.
- ``engine.queue``   the queue state machine: ``apply(meta, command) -> (reply, effects)``.
- ``engine.cluster`` the cluster metadata machine (nodes, queue definitions and placement,
                     users, token digests) and the pure plans built on it: placement,
                     reconciling a node's replicas.
- ``engine.storage`` WAL, mem tables, segments, checkpoints, compaction, behind a disk interface.
- ``engine.runtime`` the asyncio shell that hosts many queues on one node and performs effects.
- ``engine.sim``     the deterministic simulator that runs the same core on a fake clock,
                     network and disk.
- ``engine.node_key`` the node's secret and the keys derived from it (receipts).

Nothing in ``engine`` imports FastAPI or SQLAlchemy; ``engine.raft``, ``engine.queue`` and
``engine.cluster`` import no I/O, clock or randomness modules at all (a test scans their
imports).
"""
