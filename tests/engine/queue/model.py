"""A plain-Python model of one queue: the oracle of the stateful tests.

It states the semantics of API.md with lists and dicts and no attention to memory: a
message is its public id; ready lanes are lists; leases a dict by delivery tag.

Time-to-live is exact: a message expires at the first command whose leader time reaches
its enqueue time plus its TTL (the smaller of its own ``ttl_ms`` and the queue's
``message_ttl_ms``), and a checkout at that time does not deliver it. For queue TTL the
enqueue time is the one the machine can know in its memory budget: enqueues are grouped in
intervals of ``enqueue_time_resolution_ms`` (an interval opens at the first enqueue at
least that long after the current one opened), and a message's enqueue time is that of
the interval's latest enqueue: never earlier than its own, less than the resolution
later, and its own when it is alone in its interval. With a resolution of 1 ms it is
the message's own time. A queue TTL set on a queue that had none counts for the messages
already there from the change.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Msg:
    mid: int
    index: int
    size: int
    level: int
    enqueued_ms: int
    expires_ms: int | None
    delivered: int = 0


@dataclass
class Lease:
    mid: int
    consumer: str
    level: int
    expires_ms: int
    overridden: bool = False


@dataclass
class Policy:
    max_length: int | None = None
    max_bytes: int | None = None
    overflow: str = "reject-publish"
    delivery_limit: int | None = 20
    dead_letter_queue: str | None = None
    message_ttl_ms: int | None = None
    priorities: int = 1
    lease_ms: int = 30_000
    max_message_bytes: int = 1 << 20


@dataclass
class Model:
    policy: Policy
    lease_ms_max: int
    dedup_window_ms: int
    dedup_ids_max: int
    batch_messages_max: int
    receive_messages_max: int
    dead_letter_retry_ms: int
    enqueue_time_resolution_ms: int
    now: int = 0
    interval_open_ms: int | None = None
    interval_msgs: list[Msg] = field(default_factory=list)
    """The messages of the enqueue interval opened at ``interval_open_ms``."""
    msgs: dict[int, Msg] = field(default_factory=dict)
    lanes: list[list[int]] = field(default_factory=list)
    delayed: list[tuple[int, int, int]] = field(default_factory=list)
    delayed_seq: int = 0
    pending: dict[int, Lease] = field(default_factory=dict)
    next_tag: int = 1
    dlx: dict[int, tuple[str, int, int]] = field(default_factory=dict)
    dedup: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    dead_letters: list[tuple[str, int]] = field(default_factory=list)
    """(reason, mid) of every dead-letter emission, in order (drained by the test)."""
    counters: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lanes = [[] for _ in range(2 * self.policy.priorities)]
        self.counters = dict.fromkeys(
            (
                "published",
                "duplicates",
                "delivered",
                "acked",
                "returned",
                "dead_lettered",
                "expired",
                "dropped",
            ),
            0,
        )

    # --- helpers ------------------------------------------------------------------

    def lane_of(self, level: int, returns: bool) -> list[int]:
        return self.lanes[2 * (self.policy.priorities - 1 - level) + (0 if returns else 1)]

    def expiry(self, m: Msg) -> int | None:
        e = m.expires_ms
        if self.policy.message_ttl_ms is not None:
            q = m.enqueued_ms + self.policy.message_ttl_ms
            e = q if e is None else min(e, q)
        return e

    def expired(self, mid: int) -> bool:
        e = self.expiry(self.msgs[mid])
        return e is not None and e <= self.now

    def ready_count(self) -> int:
        return sum(len(lane) for lane in self.lanes)

    def waiting(self) -> tuple[int, int]:
        mids = [mid for lane in self.lanes for mid in lane] + [d[2] for d in self.delayed]
        return len(mids), sum(self.msgs[mid].size for mid in mids)

    def over(self, extra_n: int = 0, extra_b: int = 0) -> bool:
        n, b = self.waiting()
        p = self.policy
        return (p.max_length is not None and n + extra_n > p.max_length) or (
            p.max_bytes is not None and b + extra_b > p.max_bytes
        )

    def dead_letter(self, mids: list[int], reason: str) -> None:
        if not mids:
            return
        if reason == "expired":
            self.counters["expired"] += len(mids)
        if self.policy.dead_letter_queue is None:
            for mid in mids:
                del self.msgs[mid]
            self.counters["dropped"] += len(mids)
            return
        for mid in mids:
            self.dlx[mid] = (reason, self.msgs[mid].delivered, self.now)
            self.dead_letters.append((reason, mid))
        self.counters["dead_lettered"] += len(mids)

    # --- commands -----------------------------------------------------------------

    def enqueue(
        self, index: int, specs: list[tuple[int, int, int | None, int, bytes | None]]
    ) -> tuple[str, list[int], list[bool]] | tuple[str, None, None]:
        """specs: (size, priority, ttl_ms, delay_ms, dedup_id). Returns
        ("ok", ids, duplicate) or (error name, None, None)."""
        if len(specs) > self.batch_messages_max:
            return "MessageTooLarge", None, None
        if max(s[0] for s in specs) > self.policy.max_message_bytes:
            return "MessageTooLarge", None, None
        while self.dedup:
            key = next(iter(self.dedup))
            if self.dedup[key][0] > self.now:
                break
            del self.dedup[key]
        ids = [index * 1024 + k for k in range(len(specs))]
        dup = [False] * len(specs)
        seen: dict[bytes, int] = {}
        for k, s in enumerate(specs):
            key = s[4]
            if key is None:
                continue
            first = self.dedup[key][1] if key in self.dedup else seen.get(key)
            if first is not None:
                dup[k], ids[k] = True, first
            else:
                seen[key] = ids[k]
        fresh = [k for k in range(len(specs)) if not dup[k]]
        full = self.over(len(fresh), sum(specs[k][0] for k in fresh))
        if full and self.policy.overflow == "reject-publish":
            return "QueueFull", None, None
        if self.policy.message_ttl_ms is not None:
            self.note_enqueue_time()
        for key, mid in seen.items():
            self.dedup[key] = (self.now + self.dedup_window_ms, mid)
            if len(self.dedup) > self.dedup_ids_max:
                del self.dedup[next(iter(self.dedup))]
        self.counters["duplicates"] += len(specs) - len(fresh)
        self.counters["published"] += len(fresh)
        top = self.policy.priorities - 1
        for k in fresh:
            size, prio, ttl, delay, _key = specs[k]
            m = Msg(ids[k], index, size, min(prio, top), self.now, None)
            self.interval_msgs.append(m)
            if ttl is not None:
                m.expires_ms = self.now + ttl
            self.msgs[m.mid] = m
            if delay > 0:
                self.delayed.append((self.now + delay, self.delayed_seq, m.mid))
                self.delayed_seq += 1
            else:
                self.lane_of(m.level, False).append(m.mid)
        if full:
            self.drop_head()
        return "ok", ids, dup

    def note_enqueue_time(self) -> None:
        """An enqueue at ``now``: it joins the open interval, whose messages' enqueue time
        becomes ``now``, or opens the next one."""
        opened = self.interval_open_ms
        if opened is not None and self.now < opened + self.enqueue_time_resolution_ms:
            for m in self.interval_msgs:
                m.enqueued_ms = self.now
        else:
            self.interval_open_ms = self.now
            self.interval_msgs = []

    def drop_head(self) -> None:
        dropped: list[int] = []
        while self.over():
            lane = next(
                (
                    self.lanes[i]
                    for pair in range(len(self.lanes) - 2, -1, -2)
                    for i in (pair, pair + 1)
                    if self.lanes[i]
                ),
                None,
            )
            if lane is not None:
                dropped.append(lane.pop(0))
            else:
                self.delayed.sort()
                dropped.append(self.delayed.pop(0)[2])
        self.dead_letter(dropped, "maxlen")

    def advance(self) -> tuple[int, int, int]:
        self.delayed.sort()
        released = 0
        while self.delayed and self.delayed[0][0] <= self.now:
            _due, _seq, mid = self.delayed.pop(0)
            self.lane_of(self.msgs[mid].level, False).append(mid)
            released += 1
        ended = sorted(
            (lease.expires_ms, tag)
            for tag, lease in self.pending.items()
            if lease.expires_ms <= self.now
        )
        self.give_back([tag for _e, tag in ended])
        expired: list[int] = []
        for lane in self.lanes:
            while lane and self.expired(lane[0]):
                expired.append(lane.pop(0))
        self.dead_letter(expired, "expired")
        return len(ended), len(expired), released

    def give_back(self, tags: list[int]) -> None:
        over: list[int] = []
        for tag in tags:
            lease = self.pending.pop(tag)
            m = self.msgs[lease.mid]
            m.delivered += 1
            limit = self.policy.delivery_limit
            if limit is not None and m.delivered >= limit:
                over.append(m.mid)
            else:
                self.lane_of(m.level, True).append(m.mid)
        self.counters["returned"] += len(tags) - len(over)
        self.dead_letter(over, "delivery_limit")

    def checkout(self, consumer: str, n: int, lease_ms: int) -> list[tuple[int, int, int, int]]:
        """Returns (tag, mid, level, delivery_count) per delivery."""
        self.advance()
        lease_ms = min(lease_ms or self.policy.lease_ms, self.lease_ms_max)
        wanted = min(n, self.receive_messages_max)
        out: list[tuple[int, int, int, int]] = []
        expired: list[int] = []
        for level in range(self.policy.priorities - 1, -1, -1):
            for returns in (True, False):
                lane = self.lane_of(level, returns)
                while lane and len(out) < wanted:
                    mid = lane.pop(0)
                    if self.expired(mid):
                        expired.append(mid)
                        continue
                    tag = self.next_tag
                    self.next_tag += 1
                    self.pending[tag] = Lease(mid, consumer, level, self.now + lease_ms)
                    out.append((tag, mid, level, self.msgs[mid].delivered + 1))
        self.dead_letter(expired, "expired")
        self.counters["delivered"] += len(out)
        return out

    def valid(self, receipts: list[tuple[int, int]]) -> list[bool]:
        seen: set[int] = set()
        ok = []
        for tag, mid in receipts:
            good = tag not in seen and tag in self.pending and self.pending[tag].mid == mid
            if good:
                seen.add(tag)
            ok.append(good)
        return ok

    def settle(self, receipts: list[tuple[int, int]]) -> list[bool]:
        ok = self.valid(receipts)
        for (tag, _mid), good in zip(receipts, ok, strict=True):
            if good:
                del self.msgs[self.pending.pop(tag).mid]
        self.counters["acked"] += sum(ok)
        return ok

    def return_(self, receipts: list[tuple[int, int]]) -> list[bool]:
        ok = self.valid(receipts)
        self.give_back([tag for (tag, _m), good in zip(receipts, ok, strict=True) if good])
        return ok

    def discard(self, receipts: list[tuple[int, int]]) -> list[bool]:
        ok = self.valid(receipts)
        mids = []
        for (tag, _mid), good in zip(receipts, ok, strict=True):
            if good:
                m = self.msgs[self.pending.pop(tag).mid]
                m.delivered += 1
                mids.append(m.mid)
        self.dead_letter(mids, "rejected")
        return ok

    def extend(self, receipts: list[tuple[int, int]], lease_ms: int) -> list[bool]:
        ok = self.valid(receipts)
        lease_ms = min(lease_ms or self.policy.lease_ms, self.lease_ms_max)
        for (tag, _mid), good in zip(receipts, ok, strict=True):
            if good:
                self.pending[tag].expires_ms = self.now + lease_ms
                self.pending[tag].overridden = True
        return ok

    def purge(self) -> int:
        mids = [mid for lane in self.lanes for mid in lane] + [d[2] for d in self.delayed]
        for lane in self.lanes:
            lane.clear()
        self.delayed.clear()
        for mid in mids:
            del self.msgs[mid]
        self.counters["dropped"] += len(mids)
        return len(mids)

    def expire(self) -> tuple[int, int, int]:
        result = self.advance()
        due = self.now - self.dead_letter_retry_ms
        by_reason: dict[str, list[int]] = {}
        for mid, (reason, _count, ms) in self.dlx.items():
            if ms <= due:
                by_reason.setdefault(reason, []).append(mid)
        for reason in sorted(by_reason):
            for mid in by_reason[reason]:
                _r, count, _ms = self.dlx[mid]
                self.dlx[mid] = (reason, count, self.now)
                self.dead_letters.append((reason, mid))
        return result

    def set_policy(self, changes: dict[str, object]) -> None:
        ttl_before = self.policy.message_ttl_ms
        for name, value in changes.items():
            setattr(self.policy, name, value)
        if self.policy.dead_letter_queue is None and self.dlx:
            for mid in self.dlx:
                del self.msgs[mid]
            self.counters["dropped"] += len(self.dlx)
            self.dlx.clear()
        if ttl_before is None and self.policy.message_ttl_ms is not None:
            for m in self.msgs.values():
                m.enqueued_ms = self.now
            self.interval_open_ms, self.interval_msgs = None, []
        if self.policy.overflow == "drop-head":
            self.drop_head()

    def confirm(self, mids: list[int]) -> int:
        count = 0
        for mid in mids:
            if mid in self.dlx:
                del self.dlx[mid]
                del self.msgs[mid]
                count += 1
        return count

    # --- observations -------------------------------------------------------------

    def ready_order(self) -> list[tuple[int, int, int]]:
        """(mid, level, delivered) of ready messages in delivery order."""
        out = []
        for lane_no, lane in enumerate(self.lanes):
            level = self.policy.priorities - 1 - lane_no // 2
            out += [(mid, level, self.msgs[mid].delivered) for mid in lane]
        return out

    def live_indexes(self) -> set[int]:
        mids = [mid for lane in self.lanes for mid in lane]
        mids += [d[2] for d in self.delayed]
        mids += [lease.mid for lease in self.pending.values()]
        mids += list(self.dlx)
        return {self.msgs[mid].index for mid in mids}

    def next_deadline(self) -> int | None:
        """The earliest time at which an expire command has something to do: a delayed
        message due, a lease ending, a lane head expiring, a dead-letter to emit again."""
        times = [due for due, _seq, _mid in self.delayed]
        times += [lease.expires_ms for lease in self.pending.values()]
        heads = [self.expiry(self.msgs[lane[0]]) for lane in self.lanes if lane]
        times += [e for e in heads if e is not None]
        times += [ms + self.dead_letter_retry_ms for _r, _n, ms in self.dlx.values()]
        return min(times, default=None)

    def consumers(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for lease in self.pending.values():
            out[lease.consumer] = out.get(lease.consumer, 0) + 1
        return dict(sorted(out.items()))
