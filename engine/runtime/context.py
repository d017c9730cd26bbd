"""What the parts of a node share: its state, the operations they all use, and each other.

Rule: a node is split by concept into parts (``hosting``, ``applying``, ``timers``,
``routing``, ``queue_ops``, ``catalog``, ``member_changes``, ``dead_letter_routing``,
``checkpoints``, ``paging``, ``memory_alarm``, ``hibernation``). Each part is given the node's one ``NodeContext`` and reaches the node's
state and the other parts only through the public members below; ``Node`` owns the
context, runs the lifecycle (it opens ``storage`` and sets ``running``) and implements
``QueueEngine`` over the parts. Everything here is touched only on the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from engine.errors import Backpressure, NoLeader, QueueNotFound, QuorraError
from engine.ids import NodeName
from engine.limits import Limits
from engine.publish_trace import PublishTrace, Stage
from engine.raft.events import Propose
from engine.raft.server import Role
from engine.runtime.applying import Effects
from engine.runtime.catalog import Catalog
from engine.runtime.checkpoints import Checkpoints
from engine.runtime.clock import Clock
from engine.runtime.dead_letter_routing import DeadLetters
from engine.runtime.deadlines import Deadlines
from engine.runtime.forwarding import Forwarder
from engine.runtime.hibernation import Hibernation
from engine.runtime.hosting import Hosting
from engine.runtime.member_changes import Membership
from engine.runtime.memory_alarm import MemoryWatch
from engine.runtime.meta import QueueMeta
from engine.runtime.meta_group import MetaGroup
from engine.runtime.meta_members import MetaMembers
from engine.runtime.moving import Mover
from engine.runtime.paging import Pages
from engine.runtime.queue_ops import QueueOps
from engine.runtime.receiving import Receiving
from engine.runtime.reconciling import Reconciler
from engine.runtime.replica import Proposal, Replica
from engine.runtime.routing import Router
from engine.runtime.timers import Timers
from engine.runtime.transport import Transport
from engine.runtime.wal_writer import LONE_BATCH_BYTES_MAX, WalWriter
from engine.storage import NodeStorage

T = TypeVar("T")


class NodeContext:
    """The state of one node and its parts, shared by the parts (see the module's rule)."""

    def __init__(
        self,
        data_dir: Path,
        name: NodeName,
        limits: Limits,
        clock: Clock,
        transport: Transport,
        receipt_key: bytes | None,
    ) -> None:
        self.data_dir = data_dir
        self.name = name
        self.limits = limits
        self.clock = clock
        """Timers count on its monotonic clock; entries are stamped with its wall clock."""
        self.transport = transport
        self.receipt_key = receipt_key
        """Seals receipts; ``None``: derived from the data directory's secret at start."""
        self.replicas: dict[str, Replica] = {}
        """The replicas this node serves, by queue name."""
        self.by_uid: dict[str, Replica] = {}
        """The same replicas, by queue uid (the Raft group's)."""
        self.failed: dict[str, tuple[QueueMeta, QuorraError]] = {}
        """Queues whose recovery was refused: listed, every call raises the error."""
        self.removed: dict[str, asyncio.Future[None]] = {}
        """Deletions waiting for storage's ``Removed``, by uid."""
        self.writer: WalWriter | None = None
        """The WAL writer thread, from ``Node.start`` on."""
        self.trace: PublishTrace | None = None
        """Stamps the stages of publishes made one at a time (``Node.trace_publishes``)."""
        self.running = False
        """Started and not yet stopping: serves peers and Raft traffic."""
        self.stopping = False
        """A graceful stop began: new requests are refused, long polls end."""
        self.create_lock = asyncio.Lock()
        """Serialises the creation of replicas (the check for a name, then the host)."""
        self.inflight_requests = 0
        """Client requests admitted and not yet finished (``admit``)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._storage: NodeStorage | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._jobs: set[asyncio.Future[None]] = set()
        self._admission = Admission(self)
        self._deadlines: Deadlines | None = None
        """The proposals' timeouts, made on the first proposal (on the node's loop)."""
        # The parts, last: each may read the members above as it is made.
        self.pages = Pages(self)
        self.memory = MemoryWatch(self)
        self.hosting = Hosting(self)
        self.hibernation = Hibernation(self)
        self.effects = Effects(self)
        self.timers = Timers(self)
        self.router = Router(self)
        self.forwarder = Forwarder(self)
        self.ops = QueueOps(self)
        self.catalog = Catalog(self)
        self.membership = Membership(self)
        self.dead_letters = DeadLetters(self)
        self.checkpoints = Checkpoints(self)
        self.receiving = Receiving(self)
        self.meta_group: MetaGroup | None = None
        """The cluster metadata group's replica on a cluster node (``Node(cluster=...)``);
        ``None`` on a single node, whose queues are its own catalog's."""
        self.reconciler = Reconciler(self)
        self.mover = Mover(self)
        self.meta_members = MetaMembers(self)
        """Moves the replicas of led queues off draining and lost nodes (cluster nodes)."""

    # --- what the lifecycle sets ---------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The node's event loop, from ``Node.start`` on."""
        assert self._loop is not None, "Node.start first"
        return self._loop

    @loop.setter
    def loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def storage(self) -> NodeStorage:
        """The node's storage, from ``Node.start`` on: the loop's alone (a worker touches
        only the disk, in a ``job`` prepared and finished on the loop)."""
        assert self._storage is not None, "Node.start first"
        return self._storage

    @storage.setter
    def storage(self, storage: NodeStorage) -> None:
        self._storage = storage

    @property
    def has_storage(self) -> bool:
        return self._storage is not None

    # --- what every part uses ------------------------------------------------------------

    def replica(self, name: str) -> Replica:
        """The replica of queue ``name``, or the operating error a call on it raises."""
        rep = self.replicas.get(name)
        if rep is None:
            failed = self.failed.get(name)
            if failed is not None:
                raise failed[1]
            raise QueueNotFound(f"no queue {name}")
        return rep

    def admit(self) -> Admission:
        """Count a client request in flight, within the node's limit; a graceful stop
        waits a moment for the requests counted here (``async with ctx.admit(): ...``)."""
        return self._admission

    async def propose(
        self,
        rep: Replica,
        command: bytes,
        on_applied: Callable[[object], object] | None = None,
    ) -> object:
        """Propose ``command`` on the replica, which must lead, and wait until its entry
        applies: the machine's reply (``on_applied(reply)`` if given, as it applies), or
        the operating error it was rejected or lost with."""
        if rep.closed:
            raise rep.close_error or QueueNotFound(f"queue {rep.name} is gone")
        if rep.failed is not None:
            raise rep.failed
        if rep.raft.role is not Role.LEADER:
            raise NoLeader(f"queue {rep.name}: this replica does not lead")
        request_id = rep.next_request_id
        rep.next_request_id += 1
        future: asyncio.Future[object] = self.loop.create_future()
        rep.own_proposals()[request_id] = Proposal(future, on_applied)
        self.timers.tick_to_propose(rep)
        trace = self.trace
        if trace is not None:
            trace.stamp(Stage.PROPOSED)
        rep.raft.step(Propose(request_id, (command,)))
        # Not ``asyncio.wait_for``: that builds a waiter future, a timer and callbacks
        # around every proposal; one timer serves every proposal's timeout (Deadlines).
        deadlines = self._deadlines
        if deadlines is None:
            deadlines = self._deadlines = Deadlines(
                self.loop, self.limits.proposal_timeout_ms / 1000, _no_quorum_in_time
            )
        deadlines.add(future, rep.name)
        try:
            writer = self.writer
            if writer is not None and writer.idle and not rep.scheduled:
                # The disk is free: write this entry now rather than at the next turn
                # of the loop. Proposals made while it is written wait for the next
                # turn and go together, in the batch after this one (group commit).
                if len(command) <= LONE_BATCH_BYTES_MAX and _lone(rep):
                    # No peer to send it to first: the loop may sync it itself, at the
                    # next turn if nothing joined it by then (``Hosting.write_lone``).
                    # Not a larger entry, which the loop would not write: its thread
                    # is woken now, to start as soon as the loop lets the GIL go.
                    writer.hold()
                    try:
                        self.hosting.process(rep, proposed=True)
                    finally:
                        self.loop.call_soon(self.hosting.write_lone, rep)
                else:
                    self.hosting.process(rep, proposed=True)
            else:
                self.hosting.schedule(rep)
            reply = await future
            if trace is not None:
                trace.stamp(Stage.RESUMED)
            return reply
        finally:
            rep.proposals.pop(request_id, None)
            if not rep.proposals:
                rep.release_proposals()  # an emptied dict keeps its table (160 bytes)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as a task of the node: a stop cancels it and waits for it."""
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @contextlib.asynccontextmanager
    async def job(self) -> AsyncIterator[None]:
        """Storage work prepared on the loop, run by a worker and finished on the loop:
        a stop closes storage only once every job has finished."""
        done: asyncio.Future[None] = self.loop.create_future()
        self._jobs.add(done)
        try:
            yield
        finally:
            self._jobs.discard(done)
            done.set_result(None)

    async def in_worker(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread. A caller cancelled meanwhile still waits
        for the worker, so that what it does next on the loop (finish a job, close
        storage) comes after the worker's I/O."""
        worker = self.loop.run_in_executor(None, functools.partial(fn, *args))
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            await asyncio.wait([worker])
            raise

    async def end_work(self) -> None:
        """At a stop: cancel every task (``spawn``) and wait for it, then wait for every
        job. A cancelled task waits for its worker (``in_worker``), and a request past
        the stop's grace period may still be in a job: storage may close after this."""
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        while self._jobs:
            await asyncio.wait(set(self._jobs))
        if self._deadlines is not None:
            self._deadlines.close()  # every proposal was answered by the replicas' close
            self._deadlines = None


class Admission:
    """``NodeContext.admit``: a class, not ``contextlib.asynccontextmanager``, whose
    async generator (made, registered with the loop and closed on every request) cost
    more than the count it guards. It holds no state of its own: one serves every
    request of the node. Admitting awaits nothing, so it is a plain context manager
    too (``with ctx.admit():``), which the busiest calls use: ``async with`` makes and
    runs two coroutines more on every request."""

    __slots__ = ("ctx",)

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> None:
        ctx = self.ctx
        if not ctx.running or ctx.stopping:
            raise NoLeader(f"node {ctx.name} is not running")
        if ctx.inflight_requests >= ctx.limits.inflight_requests_per_node_max:
            raise Backpressure(f"node {ctx.name}: too many requests in flight")
        ctx.inflight_requests += 1

    def __exit__(self, *exc_info: object) -> None:
        self.ctx.inflight_requests -= 1

    async def __aenter__(self) -> None:
        self.__enter__()

    async def __aexit__(self, *exc_info: object) -> None:
        self.__exit__()


def _no_quorum_in_time(name: str) -> NoLeader:
    """What a proposal with no answer within ``proposal_timeout_ms`` fails with."""
    return NoLeader(f"queue {name}: no quorum in time; the outcome is unknown")


__all__ = ["Admission", "NodeContext"]


def _lone(rep: Replica) -> bool:
    """The replica's group is itself alone: a write of its leader goes to no peer, so its
    own sync is all a commit waits for."""
    config = rep.raft.config
    return len(config.voters) == 1 and not config.learners
