"""Durable log storage of a node: one shared WAL with group commit, per-server mem tables
and segment files, checkpoints and snapshots, recovery. All I/O goes through a ``Disk``.

Using it (the runtime and the simulator do the same, the runtime with two threads)::

    storage = NodeStorage.open(OsDisk(data_dir))        # or FakeDisk() in the simulator
    rec = storage.open_server(uid, repairable=has_peers) # RecoveryRefused if damaged
    # and not repairable. Restore the machine from rec.checkpoint (if any), hand rec.log
    # (a LogStore) and rec.hard_state to the Raft core, re-apply committed entries after
    # the checkpoint; with rec.repairing, start the core with repair=True and, once a
    # Ready says ``repaired`` and its hard state is durable, call finish_repair(uid).

    # for each Ready of the core, step 1 (durable before dependent messages):
    storage.save_hard_state(uid, HardState(term, vote, commit))
    storage.append(uid, ready.entries_to_persist)        # from index i: replaces i and after

    # group commit: one write + one fdatasync for every pending op of every server
    events = storage.complete(storage.write_batch())     # synchronous (simulator)
    # events: Persisted(uid, index, term), HardStateSaved, SnapshotReset, WriteFailed
    # -> Raft Persisted(index, term); send messages_after_persist for that server.
    storage.flush_segments()                             # after a WAL roll (or use sync())
    storage.close()                                      # clean stop: roll + flush, so the
                                                         # next open replays no WAL

Threads in the real runtime: the writer thread (``engine.runtime.wal_writer.WalWriter(
storage.wal, on_batch)``) calls ``wal.write_batch`` whenever something is pending and
passes each ``WalBatch`` to ``on_batch`` in its thread; forward it to the loop (the
node wakes it with ``wal_writer.LoopWakeup``; ``loop.call_soon_threadsafe`` serves too)
and call ``storage.complete(batch)`` there (mem tables change only there; a submit that
finds nothing pending wakes the writer through ``Wal.waker``). When ``rolled_wal_files()`` is non-empty:
``flush = storage.prepare_segment_flush()`` on the loop, ``flush.write()`` in a worker,
``storage.finish_segment_flush(flush)`` back on the loop; or, to keep the WAL file's
delete and directory sync off the loop too: ``storage.show_flushed(flush)`` and, when it
says the file may go, ``flush.remove_wal_file()`` in a worker, then
``storage.wal_file_removed(flush)`` on the loop.

Machine effects: ``CheckpointRequest`` -> ``write_checkpoint(uid, Checkpoint(...))``
(the log is kept); ``ReleaseCursor`` -> ``release_cursor(uid, index)`` (promotes the
newest checkpoint at or below it to the snapshot; segments before it without a live entry
are deleted). Payload reads, also of live entries before the snapshot:
``storage.log(uid).read(index)``.

Compaction (``compaction.py`` has the design): a snapshot is the newest checkpoint plus
the live entries before it. ``compact(uid, phase)`` with ``"auto"`` (after each
checkpoint) or 1, 2, 3 promotes the newest checkpoint, then deletes segments without a
live entry (1), cuts dead tails (2) and rewrites sparse runs of segments (3), cheapest
first, until dead entries are at most ``compaction_dead_per_100_live_max`` per 100 live;
it returns a ``CompactionResult``. In the runtime: ``job = prepare_compaction(uid,
phase)`` on the loop, ``job.run()`` in a worker, ``finish_compaction(job)`` on the loop.
``segment_stats(uid)`` counts each segment's live and dead entries. A reader that uses
segments across steps or from another thread takes ``pin_reader(uid, lo, hi)`` (release
it on the loop): its files stay until released. The segment writer leaves out entries
that died before their flush. A lagging follower or new member: ``held_live(uid, live)``
says which live entries it holds; ``install_snapshot`` then needs only the others.

Segment flush: ``flush_segments`` (and ``SegmentFlush.write``) report a disk error as
``StorageFailed`` and lose nothing: the entries stay in the mem tables and the WAL file
stays until a later flush succeeds. A snapshot from the leader: ``install_snapshot(uid,
checkpoint, live_entries)``. Deleting a queue: ``remove_server(uid)`` (``Removed`` follows). The simulator's plug is ``engine.sim.disk_storage
.SimDiskStorage`` (one ``NodeStorage`` on a ``FakeDisk`` per simulated server).

Errors: a refused write (disk full, I/O error) comes back as ``WriteFailed`` and the
server's further writes raise ``StorageFailed``; nothing durable is damaged, other
servers keep working if the disk accepts their writes. A CRC failure on read raises
``EntryDamaged`` (a ``StorageFailed`` with the first index not to trust): the caller
records the repair with ``mark_damaged(uid, error)`` and opens the storage again.

Repair (``repair.py`` plans it, ``recovery.py`` applies it; rules at the top of each):
damaged data is never served and never refuses the node. Recovery reads segment headers,
checkpoints and the log after the checkpoint (CRC32C on every read), not the whole log.
A corrupt entry after the checkpoint, committed entries missing, or a corrupt WAL record
(whose owner is unknown: every server keeps only what preceded it) cut the log before
the first entry not to trust; a damaged segment header, snapshot, or a lost live entry
before the checkpoint reset the server to an empty log (term and vote kept) for a
snapshot from the leader. The server is then repairing (``Recovered.repairing``,
``repairing(uid)``) until ``finish_repair``; a marker file makes the repair and its cut
survive crashes. Compaction only deletes segments during a repair.

Layout under the data directory: ``wal/<seq>.wal``,
``queues/<uid>/segments/<seq>.seg``, ``queues/<uid>/checkpoints/<index>.chk``,
``queues/<uid>/snapshots/<index>.chk`` (the promoted checkpoint), ``queues/<uid>/repair``
(while repairing), ``queues/<uid>/pages/<handle>.page`` and ``<index>.pin`` (the spilled
pages of a paged machine's ready index and the pages each checkpoint names: a
``PageFiles`` per queue, outside ``NodeStorage``, ``page_files.py``). File formats are
described at the top of ``wal.py``, ``segment.py``, ``checkpoint.py``, ``repair.py`` and
``page_files.py``.
"""

from __future__ import annotations

from engine.storage.checkpoint import Checkpoint, CheckpointStore, checkpoint_of
from engine.storage.compaction import (
    CompactionJob,
    CompactionResult,
    SegmentStat,
)
from engine.storage.disk import Disk, DiskFile, FakeDisk, OsDisk
from engine.storage.node_storage import (
    HardStateSaved,
    NodeStorage,
    Persisted,
    Recovered,
    Removed,
    SegmentFlush,
    SnapshotReset,
    StorageEvent,
    WriteFailed,
)
from engine.storage.reaper import PinnedReader
from engine.storage.server_log import ServerLog
from engine.storage.wal import HardState, Wal, WalBatch
from engine.storage.wal_stats import SYNC_BUCKETS_S, WalStats

__all__ = [
    "SYNC_BUCKETS_S",
    "Checkpoint",
    "CheckpointStore",
    "CompactionJob",
    "CompactionResult",
    "Disk",
    "DiskFile",
    "FakeDisk",
    "HardState",
    "HardStateSaved",
    "NodeStorage",
    "OsDisk",
    "Persisted",
    "PinnedReader",
    "Recovered",
    "Removed",
    "SegmentFlush",
    "SegmentStat",
    "ServerLog",
    "SnapshotReset",
    "StorageEvent",
    "Wal",
    "WalBatch",
    "WalStats",
    "WriteFailed",
    "checkpoint_of",
]
