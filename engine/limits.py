"""Every bound of the engine, in one place, units last, relations asserted.

A limit that is exceeded is an explicit, typed rejection (see ``engine.errors``), never
unbounded growth. Layers read the fields of their own section; a test builds ``Limits``
with small values to reach the bounds quickly.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class Limits:
    # --- raft -----------------------------------------------------------------------
    tick_ms: int = 10
    """How often the runtime delivers a Tick to each Raft server."""
    election_timeout_ms_min: int = 300
    election_timeout_ms_max: int = 600
    heartbeat_interval_ms: int = 50
    append_entries_per_message_max: int = 512
    append_bytes_per_message_max: int = 1 * MIB
    inflight_messages_per_follower_max: int = 64
    inflight_bytes_per_follower_max: int = 16 * MIB
    append_stall_ms: int = 300
    """A pipeline to a follower that moved neither its match nor what it was seen to
    receive for this long lost something: the leader sends from its match again. Two
    heartbeat intervals were too few with three processes on two cores: a follower's
    read or fsync took longer, and resending everything in flight doubled what was sent."""
    append_unacked_ms_max: int = 1_000
    """Appends seen to arrive keep a pipeline alive only while the follower's match moved
    within this long: what it holds may never become durable (a failed or damaged disk),
    and it is sent again."""
    uncommitted_bytes_max: int = 64 * MIB
    """Proposals beyond this many uncommitted bytes are rejected (back-pressure)."""
    snapshot_chunk_bytes: int = 1 * MIB
    committed_entries_per_ready_max: int = 1024
    committed_bytes_per_ready_max: int = 16 * MIB
    """One ``Ready`` hands out at most this many committed entries (at least one, whatever
    its size): a replay after a restart goes in bounded steps, not one list of the tail."""
    catch_up_rounds_max: int = 10
    """A learner is promoted once it is within one round of the leader, tried this often."""

    # --- storage --------------------------------------------------------------------
    wal_file_bytes_max: int = 16 * MIB
    """The WAL rolls to a new file after the batch that reaches this size. It bounds the
    entries held in memory: the mem tables keep every entry of the current file until it
    rolls and they are flushed to segments (256 MiB held a quarter of a million 1 KiB
    messages in memory), and the WAL replayed after a crash. A batch may carry a file
    past it (one batch is never split), hence no relation to ``wal_batch_bytes_max``."""
    wal_idle_roll_ms: int = 5_000
    """A WAL file that holds anything and has had nothing to write for this long rolls, so
    that its entries are flushed to segments and leave the mem tables: an idle server
    keeps no message bodies in memory (up to ``wal_file_bytes_max`` of them otherwise)."""
    wal_carry_entries_max: int = 2
    wal_carry_log_bytes_max: int = 512
    """A log that wrote at most this many entries and bytes of data to a WAL file that
    rolls has them carried into the next file instead of written to a segment
    (``engine.storage.wal_carry``): a restart of 10,000 idle queues wrote a leader's
    first entry of each, and a receive, and made 10,000 segment files at each of the
    next rolls. Small, as carried entries stay in memory: a queue that wrote more (a
    publish, or the ack after the receive) reaches a segment at the next roll, and its
    mem table empties as before."""
    wal_carry_bytes_max: int = 4 * MIB
    """What a new WAL file carries at most, in all, and never more than a quarter of
    ``wal_file_bytes_max``, so that a file that carries still has room to fill."""
    wal_batch_bytes_max: int = 32 * MIB
    """The WAL writer takes at most this much into one write + fdatasync."""
    segment_file_bytes_max: int = 64 * MIB
    segment_entries_max: int = 65_536
    segment_readers_open_max: int = 64
    segment_flush_writers_max: int = 16
    """Threads that write the segments of one WAL file's flush at once, a queue each
    (on a disk that allows it, ``Disk.concurrent``): every segment costs two fsyncs, and
    the file system commits concurrent ones together. A flush of 500 queues took 4.6 s
    on one thread and 0.25 s on 16 (ext4 on a virtual disk)."""
    segment_flush_batch_plans_min: int = 64
    """A flush of at least this many logs writes all its segments, then makes them
    durable together (``write_files_atomic``: two syncs of the whole disk) instead of
    two fsyncs per segment. A flush of 10,000 logs of one entry each took 10.6 s (8.4 s
    of CPU) on 16 threads and 8.2 s (7.3 s) so: most of it is the kernel making 10,000
    files (about 0.5 ms each on ext4 here), which ``wal_carry_*`` spares idle logs."""
    bulk_free_trim_min: int = 100
    """Logs flushed or queues put to sleep at once after which the node gives the C
    allocator's free memory back (``MemoryWatch.freed_in_bulk``): a trim walks the free
    chunks (milliseconds for tens of MiB), so it follows bulk frees only, not every
    flush of a busy node's few logs."""
    segment_flush_logs_max: int = 512
    """Logs one segment flush takes (``plan_segment_flush``): a WAL file whose rows are
    of more logs is flushed in several, its file deleted after the last. The logs of
    sleeping queues are unpacked for the flush and packed again after it, and each
    one's entries and encoded segment are held until it is shown: 10,000 at once held
    their peak in the server's RSS after they were freed (see ``ServerLogs``)."""
    read_run_bytes_max: int = 4 * MIB
    """A receive reads the entries of its messages a run of consecutive indexes at a
    time, one ``pread`` per segment; a run longer than this is read in several (each at
    least one entry, so one entry of ``entry_bytes_max`` still reads whole)."""
    read_cache_bytes_max: int = 16 * MIB
    """The node's cache of segment reads (``engine.storage.read_cache``), shared by its
    queues, holds at most this many bytes of entries (0: none kept). It counts in the
    engine's memory, but the memory alarm leaves it only the room publishes do not need
    (it is memory the node can give back at once)."""
    read_cache_block_bytes: int = 256 * KIB
    """A delivery that reads from a segment reads, in the same ``pread``, the entries
    after those it wants up to this many bytes in all, and the cache keeps the block: the
    next receives of the queue find their entries in memory."""
    checkpoints_kept_max: int = 8
    entry_bytes_max: int = 32 * MIB

    # --- queue ----------------------------------------------------------------------
    message_bytes_max: int = 1 * MIB
    """Default of a queue's ``max_message_bytes``; a queue may lower it."""
    message_bytes_max_ceiling: int = 16 * MIB
    """No queue may set ``max_message_bytes`` above this."""
    batch_messages_max: int = 1000
    batch_bytes_max: int = 16 * MIB
    publish_group_messages_max: int = 64
    """The single publishes to one queue that arrive in one turn of the loop are proposed
    as one entry (``engine.runtime.publish_groups``) of at most this many messages (and
    at most ``batch_messages_max``); a publish that would make its group larger goes
    alone. 0: no grouping."""
    receive_messages_max: int = 1000
    receive_wait_ms_max: int = 20_000
    lease_ms_default: int = 30_000
    lease_ms_max: int = 12 * 3600 * 1000
    delivery_limit_default: int = 20
    priorities_max: int = 10
    headers_bytes_max: int = 16 * KIB
    dedup_window_ms: int = 5 * 60 * 1000
    dedup_ids_max: int = 1_000_000
    """Dedup ids a queue remembers at most: a full window holds about 56 bytes per id
    beside the id's own bytes (``engine.queue.dedup``), 92 MB for a million 36-byte ids."""
    page_refs: int = 4096
    """References per page of the ready FIFO."""
    dead_bytes_per_live_checkpoint_factor: int = 2
    replay_bytes_max: int = 64 * MIB
    """A replica checkpoints once this many log bytes applied since its last checkpoint
    (a queue whose messages all stay has no dead bytes to trigger one): a restart applies
    at most this much of the log again, whatever the depth of the queue."""
    checkpoint_bytes_per_message_estimate: int = 64
    checkpoint_bytes_min: int = 1 * MIB
    """Floor of the checkpoint size estimate, so a near-empty queue does not checkpoint often."""
    enqueue_time_resolution_ms: int = 10
    """Queue TTL expires a message at most this much minus 1 ms late (never early): enqueue
    times are kept as one 8-byte sample per such interval in which something was
    published, not per message, by queues with a queue TTL (``engine.queue.enqueue_times``)."""
    dead_letter_retry_ms: int = 10_000
    """A dead-letter effect not confirmed by then is emitted again by the expire command."""

    # --- paging of the ready index (engine.queue.paging, engine.storage.page_files) ---
    paged_index_bytes_per_queue_max: int = 1 * MIB
    """A queue keeps at most this much of its ready index resident (pages counted at
    ``page_refs * 8`` bytes): the pages farthest from delivery go to page files. Its head
    and tail pages stay whatever the budget."""
    paged_index_bytes_per_node_max: int = 64 * MIB
    """The same over every queue of the node."""
    page_read_ahead: int = 4
    """Pages loaded ahead of the head of a queue, so that a steady consumer never waits
    on a load (within the budgets)."""

    # --- node memory (engine.runtime.memory_alarm) ----------------------------------
    engine_memory_bytes_max: int = 256 * MIB
    """A publish that would bring the node's engine memory (every queue machine's
    ``memory_bytes``, its resident index pages included, the publish bytes in flight, the
    WAL's mem tables; the read cache gives its bytes back first) past this is refused
    (``MemoryAlarm``, 429) until it is back under."""
    memory_check_interval_ms: int = 100
    """The node's engine memory is summed over its queues at most this often (a sum per
    publish would cost in proportion to the queues); the alarm clears within it."""
    memory_check_spacing_factor: int = 20
    """...and at most once per this many times the last sum took: a sum over 10,000
    queues takes about half a second, and one every 100 ms took the whole loop."""

    # --- compaction -----------------------------------------------------------------
    compaction_dead_per_100_live_max: int = 30

    # --- runtime / server -----------------------------------------------------------
    queues_per_node_max: int = 10_000
    inflight_publish_bytes_per_queue_max: int = 64 * MIB
    inflight_requests_per_node_max: int = 10_000
    proposal_timeout_ms: int = 10_000
    """A proposal not applied by then raises ``NoLeader`` (its outcome is unknown)."""
    leader_wait_ms: int = 3_000
    """How long a request waits for a queue to elect a leader before ``NoLeader``."""
    poll_interval_ms: int = 5
    """How often the runtime looks again at a condition no event announces: recovery
    done at start, requests drained at stop, a new queue's first entry applied, a
    leadership transfer taken."""
    stop_grace_ms: int = 2_000
    """A stop gives requests in flight this long to finish."""
    stop_checkpoint_bytes_min: int = 1 * MIB
    """A clean stop checkpoints every queue that applied at least this much of its log
    since its last checkpoint (so that the next start applies next to nothing)."""
    queue_sleep_idle_ms: int = 30_000
    """A queue of one member sleeps (``engine.runtime.hibernation``) once it has been idle
    this long: no request, Raft event, lease, timer or waiter."""
    queue_sleep_sweep_ms: int = 1_000
    """The idle sweep runs this often, and looks at enough queues each time to see each
    about once per ``queue_sleep_idle_ms`` (10,000 queues, 30 s: 334 a run);"""
    queue_sleep_sweep_max: int = 500
    """it puts at most this many to sleep per run (about 50 us each: 25 ms of the loop)."""
    queue_sleep_catch_up_ms: int = 100
    """A run that put ``queue_sleep_sweep_max`` to sleep is followed by the next this soon
    (or after ``queue_sleep_sweep_ms``, if shorter): thousands of queues woken together
    (the first receives after a restart) otherwise stay awake for many runs, and the
    allocator keeps the memory of the most that were ever awake at once (an idle queue's
    RSS is that peak's share: ``engine.runtime.hibernation``)."""
    queue_sleep_segments_max: int = 4
    """A queue about to sleep with more segments than this written since its last
    checkpoint is checkpointed first, and compaction follows. Each wake writes entries of
    its own (its election, what it served) that reach a segment at the next roll: a queue
    that sleeps, wakes and sleeps again was never checkpointed (under
    ``stop_checkpoint_bytes_min``), so its log kept a file per wake, read at every start."""
    sleepers_bytes_max: int = 256 * MIB
    """A clean stop saves the sleeping queues' records (``engine.runtime.sleepers``) up to
    this many bytes (10,000 idle queues of 10 messages: about 12 MiB); the queues past
    it recover from their logs at the next start."""
    rate_sample_ms: int = 1_000
    """Rates (published, delivered, acked per second) are sampled at most this often."""
    rate_window_ms: int = 10_000
    """and computed over the newest samples this recent."""
    message_overhead_bytes: int = 256
    """What a message's headers and framing are counted as beside its body where a batch
    is cut to size (``dead_letter_batch_bytes_max``)."""

    # --- streams (one WebSocket per client and queue, app/api/stream.py) --------------
    stream_unconfirmed_messages_max: int = 4_096
    """Messages a stream connection has published and not yet had confirmed (or
    refused): at this many the server reads no more frames from it until confirms free
    room (back-pressure), so a connection holds at most this many plus one frame."""
    stream_unconfirmed_bytes_max: int = 32 * MIB
    """The same, in body bytes."""
    stream_prefetch_max: int = 10_000
    """The largest prefetch credit a stream consumer may ask for: messages delivered on
    the connection and not yet acked or nacked."""
    stream_settles_inflight_max: int = 16
    """Ack, nack and extend frames of one connection being settled at once; the next
    waits (and the connection is not read meanwhile)."""
    stream_receive_wait_ms: int = 5_000
    """A stream consumer's receive waits this long for a message before it is asked
    again (one checkout command per wait while the queue is empty). It bounds how long a
    closed connection's last receive may run: what it leases then is returned at once."""

    # --- cluster transport (TCP between nodes, engine.runtime.tcp_transport) ---------
    cluster_frame_bytes_max: int = 64 * MIB
    """A frame announcing a longer payload closes its connection. Room for the largest
    single item (an append of one entry of ``entry_bytes_max``, a publish batch) twice."""
    cluster_send_buffer_bytes_max: int = 64 * MIB
    """Bytes waiting to be written to one peer on one lane (two lanes per peer); Raft
    messages beyond it are dropped and counted, a call is refused (``Backpressure``)."""
    cluster_call_deadline_ms: int = 30_000
    """A call to another node unanswered by then raises ``OutcomeUnknown``. It covers
    the longest remote work: a membership change (a nested create, then up to
    ``proposal_timeout_ms``). A long-poll receive adds its wait to it."""
    cluster_calls_inflight_per_peer_max: int = 1_000
    """Calls this node awaits from one peer, and calls of one peer it runs, at once."""
    cluster_handshake_timeout_ms: int = 2_000
    """Connect, TLS and the authenticated handshake together, or the attempt is dropped."""
    cluster_handshakes_inflight_max: int = 64
    """Unauthenticated connections held at once; more are closed on accept."""
    cluster_reconnect_ms_min: int = 50
    cluster_reconnect_ms_max: int = 2_000
    """Back-off between dial attempts: doubles from min to max, each jittered."""
    cluster_ping_interval_ms: int = 250
    """A lane that sent nothing for this long sends a ping (liveness and round trip)."""
    cluster_idle_timeout_ms: int = 3_000
    """A lane that received nothing for this long is closed (a peer gone silently)."""

    # --- cluster metadata -----------------------------------------------------------
    cluster_nodes_max: int = 64
    """Nodes the cluster metadata holds, forgotten ones included; at the limit a new node
    takes the place of the node forgotten longest ago."""
    cluster_queues_max: int = 100_000
    """Queues the cluster metadata holds, tombstones not counted."""
    cluster_tombstones_max: int = 10_000
    """Deleted queues remembered; beyond it the oldest tombstone is forgotten (a replica
    of it left on some node is then an orphan, which reconciling removes all the same)."""
    cluster_users_max: int = 10_000
    cluster_tokens_max: int = 100_000
    meta_checkpoint_bytes_min: int = 64 * KIB
    """The metadata machine keeps nothing in its log: it checkpoints once the commands it
    applied since its last checkpoint weigh ``dead_bytes_per_live_checkpoint_factor``
    times its estimated size, with this floor."""
    meta_record_bytes_estimate: int = 256
    """What one node, queue, user or token weighs in a metadata checkpoint, roughly."""
    meta_heartbeat_intervals: int = 2
    """The metadata group's leader heartbeats every this many ``heartbeat_interval_ms``:
    its heartbeats were most of an idle cluster's CPU (each a message, a reply and a
    wake-up of every process), and nothing waits on its commit index between commands
    (a proposal is sent at once). Its election timeout is the queues': a dead leader is
    noticed as soon as before, two heartbeats still fit in the shortest timeout."""
    meta_voters_max: int = 5
    """Voters of the metadata group: the first of the cluster's initial members, by name."""
    reconcile_interval_ms: int = 1_000
    """Each node's reconcile loop runs after every metadata change naming queues or nodes,
    and at least this often (a report that did not commit, a peer that came back)."""
    remote_stats_max_age_ms: int = 2_000
    """A queue with no replica on a node shows its leader's stats as fetched last
    (``engine.runtime.forwarding``); older than this, they are fetched again."""
    leader_stats_deadline_ms: int = 1_000
    """Deadline of a ``StatsCall`` to a queue's leader's node: a follower then shows its own
    copy marked stale (``engine.runtime.leader_stats``), a node without a replica its kept
    copy (``engine.runtime.forwarding``)."""
    led_stats_queues_max: int = 500
    """Queues named in one ``LedStatsCall`` (``engine.runtime.leader_stats``): bounds the
    answer's size; a node leading more is asked in several calls."""
    history_records_max: int = 100
    """Checkpoint runs, and compaction runs, in one answer to a ``HistoryCall``
    (``engine.runtime.leader_history``): bounds the answer (a run encodes to a few hundred
    bytes with its queue's name); a node without a replica shows its leader's newest."""
    leader_history_deadline_ms: int = 2_000
    """Deadline of a node without a replica of a queue asking its leader's node for the
    queue's history, the leader's look-up included: past it the node answers with the
    runs it keeps itself, marked ``absent``. The leader's node reads it from SQLite."""

    # --- from peers: what a node decodes and takes (runtime wire, receiving) --------
    wire_document_bytes_max: int = 64 * MIB
    """A msgpack document (a frame's payload) larger than this does not decode. It holds
    an append or a snapshot chunk with one entry of any size, or a publish batch."""
    wire_depth_max: int = 8
    """Dataclasses nested deeper than this in one document do not decode (each is
    decoded by a recursive call: a deep nest would exhaust the stack)."""
    wire_items_max: int = 65_536
    """A list or map with more items than this does not decode."""
    wire_str_bytes_max: int = 64 * KIB
    """A string longer than this does not decode (bodies and entries are bytes)."""
    wire_packers_kept_per_thread_max: int = 4
    """Msgpack packers each thread keeps for ``wire.encode`` to use again (one per level of
    nested dataclasses being encoded at once; more are made and dropped)."""
    wire_packer_kept_bytes_max: int = 2 * MIB
    """A packer that has just encoded a larger document is dropped, not kept: its buffer
    grew to the document's size (the kept ones hold at most about twice this)."""
    peer_refusal_log_interval_ms: int = 10_000
    """A node logs the messages it refuses from peers at most once per interval (and
    counts each in ``Node.cluster()``), so a peer sending junk cannot flood the log."""

    def __post_init__(self) -> None:
        assert 0 < self.tick_ms <= self.heartbeat_interval_ms
        assert self.heartbeat_interval_ms * 2 < self.election_timeout_ms_min
        assert self.heartbeat_interval_ms * 2 <= self.append_stall_ms
        meta_heartbeat_ms = self.heartbeat_interval_ms * self.meta_heartbeat_intervals
        assert self.meta_heartbeat_intervals >= 1
        assert meta_heartbeat_ms * 2 < self.election_timeout_ms_min
        assert meta_heartbeat_ms * 2 <= self.append_stall_ms
        assert self.append_stall_ms <= self.append_unacked_ms_max
        assert self.election_timeout_ms_min < self.election_timeout_ms_max
        assert self.append_entries_per_message_max >= 1
        assert self.inflight_messages_per_follower_max >= 1
        assert self.committed_entries_per_ready_max >= 1
        assert self.committed_bytes_per_ready_max >= self.append_bytes_per_message_max
        assert self.append_bytes_per_message_max <= self.inflight_bytes_per_follower_max
        assert self.entry_bytes_max <= self.wal_batch_bytes_max
        assert self.read_run_bytes_max > 0
        assert self.queue_sleep_sweep_ms > 0 and self.queue_sleep_sweep_max > 0
        assert self.queue_sleep_catch_up_ms > 0
        assert self.queue_sleep_segments_max >= 0
        assert self.sleepers_bytes_max >= 0
        assert 0 < self.read_cache_block_bytes <= self.read_run_bytes_max
        assert self.read_cache_bytes_max >= 0
        assert self.segment_flush_writers_max >= 1
        assert self.wal_carry_entries_max >= 0 and self.wal_carry_log_bytes_max >= 0
        assert self.segment_flush_batch_plans_min >= 1 and self.segment_flush_logs_max >= 1
        assert self.bulk_free_trim_min >= 1
        assert self.batch_bytes_max <= self.entry_bytes_max
        assert self.message_bytes_max <= self.message_bytes_max_ceiling <= self.batch_bytes_max
        assert self.batch_messages_max >= 1 and self.receive_messages_max >= 1
        assert self.publish_group_messages_max >= 0
        assert 1 <= self.priorities_max <= 255
        assert self.page_refs >= 16 and self.page_refs & (self.page_refs - 1) == 0
        assert self.compaction_dead_per_100_live_max >= 0
        assert self.page_refs * 8 <= self.paged_index_bytes_per_queue_max
        assert self.paged_index_bytes_per_queue_max <= self.paged_index_bytes_per_node_max
        assert self.page_read_ahead >= 0
        assert self.paged_index_bytes_per_node_max <= self.engine_memory_bytes_max
        assert self.memory_check_interval_ms >= 1
        assert self.memory_check_spacing_factor >= 1
        assert self.checkpoints_kept_max >= 2
        assert self.leader_wait_ms >= self.election_timeout_ms_max
        assert self.enqueue_time_resolution_ms >= 1
        assert self.proposal_timeout_ms >= self.leader_wait_ms
        assert 1 <= self.poll_interval_ms <= self.tick_ms
        assert self.rate_sample_ms * 2 <= self.rate_window_ms
        # streams
        assert self.stream_unconfirmed_messages_max >= self.batch_messages_max
        assert self.stream_unconfirmed_bytes_max >= self.batch_bytes_max
        assert self.stream_prefetch_max >= 1 and self.stream_settles_inflight_max >= 1
        assert 1 <= self.stream_receive_wait_ms <= self.receive_wait_ms_max
        # cluster transport
        assert 2 * self.entry_bytes_max <= self.cluster_frame_bytes_max
        assert self.cluster_frame_bytes_max <= self.cluster_send_buffer_bytes_max
        assert self.cluster_call_deadline_ms >= 2 * self.proposal_timeout_ms
        assert 0 < self.leader_stats_deadline_ms <= self.cluster_call_deadline_ms
        assert self.led_stats_queues_max >= 1
        assert self.history_records_max >= 1
        assert 0 < self.leader_history_deadline_ms <= self.cluster_call_deadline_ms
        assert self.cluster_calls_inflight_per_peer_max >= 1
        assert self.cluster_handshakes_inflight_max >= 1
        assert 1 <= self.cluster_reconnect_ms_min <= self.cluster_reconnect_ms_max
        assert 4 * self.cluster_ping_interval_ms <= self.cluster_idle_timeout_ms
        # cluster metadata
        assert self.cluster_nodes_max >= 1 and self.cluster_tombstones_max >= 0
        assert self.meta_checkpoint_bytes_min >= 1 and self.meta_record_bytes_estimate >= 1
        # A cluster of fewer nodes than meta_voters_max has every node a voter.
        assert self.meta_voters_max >= 1
        assert self.reconcile_interval_ms >= self.poll_interval_ms
        # from peers
        assert self.wire_document_bytes_max >= self.entry_bytes_max + MIB
        assert self.wire_document_bytes_max >= self.batch_bytes_max + MIB
        assert self.wire_depth_max >= 4
        assert self.wire_packers_kept_per_thread_max >= 1
        assert self.wire_items_max >= max(
            self.batch_messages_max,
            self.receive_messages_max,
            self.append_entries_per_message_max,
        )
        assert self.wire_str_bytes_max >= self.headers_bytes_max

    @property
    def dead_letter_batch_bytes_max(self) -> int:
        """Dead-letter copies are published again in batches of at most this many bytes,
        each copy counted as its body plus ``message_overhead_bytes``: half a publish
        batch, the rest room for headers and the entry's framing."""
        return self.batch_bytes_max // 2


DEFAULT_LIMITS = Limits()

__all__ = ["DEFAULT_LIMITS", "KIB", "MIB", "Limits"]
