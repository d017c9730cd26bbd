"""engine.queue: the queue state machine (pure, deterministic) and its wire formats.

How the runtime uses it
-----------------------
* **Create** one ``QueueMachine(policy, limits)`` per queue replica, identically on
  every replica; Raft applies committed command entries with
  ``machine.apply(ApplyMeta(index, term, now_ms), command) -> (reply, effects)``.
* **Publish**: ``encode_enqueue([NewMessage(body, headers, priority, ttl_ms, delay_ms,
  dedup_id), ...])`` gives ONE log entry for a batch of up to 1000 messages, all or
  nothing. Reply ``Enqueued(ids, duplicate)`` or ``Rejected(error_class, detail)``
  (``QueueFull``, ``MessageTooLarge``...; ``reply.to_error()`` gives the exception).
* **Receive**: ``encode_checkout(consumer, max_messages, lease_ms)`` -> reply
  ``CheckedOut(tags, refs, priorities, delivery_counts, lease_expires_ms)`` (parallel
  tuples; ``.deliveries`` gives ``Delivery(tag, ref, priority, delivery_count)`` values). For each, ``machine.ref_parts(ref)`` gives ``(index, slot, size)``;
  read the log entry at ``index`` and call ``read_message(entry, slot)`` for body and
  headers (memoryviews, no copy); ``published_at`` is that entry's ``now_ms``. The
  receipt is ``ReceiptSeal(key, queue uid).seal(tag, ref)``; the public message id is
  ``message_id(index, slot)`` (= index * 1024 + slot, as in ``Enqueued.ids``).
* **Ack / nack / extend**: ``ReceiptSeal.open`` each receipt (``None``: not one of this
  queue's, report it stale without proposing it), then ``encode_settle``,
  ``encode_return`` (nack requeue), ``encode_discard`` (nack without requeue: dead-letter
  with reason ``rejected``), ``encode_extend(receipts, lease_ms)``. Reply
  ``Settled(count, stale)``: ``stale`` lists the positions of receipts whose lease is no
  longer live (HTTP 409 per receipt).
* **Receive carrying acks**: ``encode_settle_checkout(receipts, consumer, max_messages,
  lease_ms)`` settles, then checks out, in one entry (one Raft round for both). Reply
  ``SettledCheckedOut(settled, checked_out)``: exactly the ``Settled`` and ``CheckedOut``
  of the two commands applied one after the other at the same index and time.
* **Timers**: after applying, ``machine.next_deadline_ms()`` says when the leader should
  append ``encode_expire()``; that command (with the leader's ``now_ms``) releases
  delayed messages, ends leases (a lease end counts as a delivery attempt), sweeps
  expired messages and re-emits unconfirmed dead-letters.
* **Admin**: ``encode_purge()``, ``encode_policy({field: value})`` (fields of
  ``QueuePolicy``; ``priorities`` is fixed at creation), ``machine.stats()`` (with
  ``memory``, a ``MemoryUse`` breakdown of the estimated memory),
  ``machine.browse(after, limit)``.
* **Effects** (performed by the leader only): ``MessagesAvailable`` (wake long polls);
  ``DeadLetter(target, reason, refs, delivery_counts)``: publish copies to ``target``
  with dedup ids ``dlx:<source uid>:<message id>``, then propose
  ``encode_dead_letter_confirm(refs)`` here (see ``DeadLetter``); ``CheckpointRequest``
  and ``ReleaseCursor`` from ``engine.raft.state_machine`` (every replica).

* **Paging** (``engine.queue.paging``): ``QueueMachine(policy, limits, Paging(spill,
  node_pages, read_log))`` keeps only the ready pages near each lane's head and its tail
  page in memory, within ``Limits.paged_index_bytes_per_queue_max`` and the node's
  ``NodePages`` (one per node, ``NodePages.from_limits``); the others go to ``spill`` (a
  ``PageFiles`` per queue). When ``machine.pager.wants_read_ahead``: ``plan =
  pager.plan_read_ahead()`` on the loop, ``loaded = paging.load_plan(spill, plan)`` in a
  worker, ``pager.finish_read_ahead(plan, loaded)`` on the loop. A checkpoint names the
  stored pages (``frozen.page_handles()``: pin them at capture and ``sync`` them before
  writing it); a follower is sent ``snapshots.inline_snapshot(state, spill.load)``.
  ``machine.close()`` when the replica goes. ``stats().paging`` counts the pages.

Packed references (``refs``): one uint64 per message, tag bit 63 = 0: index:44 | size:15 |
slot:4; tag 10: index:37 | slot:10 | size:15; tag 11: handle into the machine's fallback
table. Receipts (``receipts``): 64 hex digits, delivery tag, ref, then a MAC binding
them to the queue.

Dedup window: a message whose ``dedup_id`` was seen in this queue within
``Limits.dedup_window_ms`` (leader time, default 5 minutes) of the first publish is
acknowledged with the first message's id and not enqueued again, whether or not the first
was consumed meanwhile. At most ``Limits.dedup_ids_max`` ids are remembered; beyond that
the oldest are forgotten early (the window shrinks, never grows).

Module rule: nothing here does I/O or reads a clock (tests/engine/test_purity.py).
"""

from engine.queue.commands import (
    OVERFLOW_DROP_HEAD,
    OVERFLOW_REJECT_PUBLISH,
    POLICY_FIELDS,
    Kind,
    QueuePolicy,
    command_kind,
    encode_checkout,
    encode_dead_letter_confirm,
    encode_discard,
    encode_expire,
    encode_extend,
    encode_policy,
    encode_purge,
    encode_return,
    encode_settle,
    encode_settle_checkout,
)
from engine.queue.effects import (
    DEAD_LETTER_REASONS,
    REASON_DELIVERY_LIMIT,
    REASON_EXPIRED,
    REASON_MAXLEN,
    REASON_REJECTED,
    CheckedOut,
    DeadLetter,
    DeadLetterConfirmed,
    Delivery,
    Enqueued,
    Expired,
    MessagesAvailable,
    PolicyChanged,
    Purged,
    Rejected,
    Settled,
    SettledCheckedOut,
)
from engine.queue.enqueue_codec import (
    KeyedBody,
    MessageView,
    NewMessage,
    encode_enqueue,
    enqueue_bytes,
    enqueue_count,
    message_run,
    read_message,
)
from engine.queue.machine import QueueMachine
from engine.queue.paging import MemorySpill, NodePages, PageSpill, Paging, PagingStats
from engine.queue.receipts import ReceiptSeal, check_receipt_text, check_receipt_texts
from engine.queue.refs import RefParts, message_id, message_id_parts
from engine.queue.stats import BrowseItem, MemoryUse, QueueStats

__all__ = [
    "DEAD_LETTER_REASONS",
    "OVERFLOW_DROP_HEAD",
    "OVERFLOW_REJECT_PUBLISH",
    "POLICY_FIELDS",
    "REASON_DELIVERY_LIMIT",
    "REASON_EXPIRED",
    "REASON_MAXLEN",
    "REASON_REJECTED",
    "BrowseItem",
    "CheckedOut",
    "DeadLetter",
    "DeadLetterConfirmed",
    "Delivery",
    "Enqueued",
    "Expired",
    "KeyedBody",
    "Kind",
    "MemorySpill",
    "MemoryUse",
    "MessageView",
    "MessagesAvailable",
    "NewMessage",
    "NodePages",
    "PageSpill",
    "Paging",
    "PagingStats",
    "PolicyChanged",
    "Purged",
    "QueueMachine",
    "QueuePolicy",
    "QueueStats",
    "ReceiptSeal",
    "RefParts",
    "Rejected",
    "Settled",
    "SettledCheckedOut",
    "check_receipt_text",
    "check_receipt_texts",
    "command_kind",
    "encode_checkout",
    "encode_dead_letter_confirm",
    "encode_discard",
    "encode_enqueue",
    "encode_expire",
    "encode_extend",
    "encode_policy",
    "encode_purge",
    "encode_return",
    "encode_settle",
    "encode_settle_checkout",
    "enqueue_bytes",
    "enqueue_count",
    "message_id",
    "message_id_parts",
    "message_run",
    "read_message",
]
