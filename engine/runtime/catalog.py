"""The queue catalog of a node: the definitions (``queue.meta``) of the queues it hosts.

Rule: a queue exists on a node while its definition file does. A create writes the
definition before the replica is hosted; a delete removes it before storage removes
the replica's files, so that a crash in between leaves an orphan that the next start
drops (``open_storage``). A definition that changes (policy, members) is written again by
a worker, one write at a time per replica, the newest last (``write_meta``). A create
or delete reaches every member through the transport (``CreateReplica``,
``DeleteReplica``); a create that failed half-way is completed by its retry.

That is a single node's way. On a cluster node a queue's existence is the metadata
log's: create and delete go through the metadata group (``engine.runtime.registry``),
and the node's reconcile loop (``engine.runtime.reconciling``) creates and drops its
replicas here (``create_replica``, ``delete_replica``, the local half of both).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import uuid
from typing import TYPE_CHECKING

from engine.errors import NoLeader, QueueConflict, QueueNotFound, ValidationFailed
from engine.ids import NodeName
from engine.names import check_queue_name
from engine.queue import PolicyChanged, encode_policy
from engine.runtime.api import QueueArgs, QueueInfo
from engine.runtime.meta import (
    QueueMeta,
    args_with,
    check_args,
    meta_path,
    queue_meta,
    read_meta,
    write_meta,
)
from engine.runtime.meta_group import META_UID
from engine.runtime.reconciling import args_of
from engine.runtime.registry import Registry
from engine.runtime.replica import Replica
from engine.runtime.routing import CreateReplica, DeleteReplica, UpdatePolicyCall
from engine.runtime.sleepers import Sleeper, take_sleepers
from engine.storage import Disk, NodeStorage, OsDisk

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext

log = logging.getLogger("quorra.engine")


class Catalog:
    """Creates, lists, changes and deletes the queues of a node."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.unreadable: set[str] = set()
        """Queue directories whose definition is unreadable: kept, served by nobody."""
        self.registry = Registry(ctx)
        """A cluster node's creates and deletes, through the metadata group."""
        self.creating: dict[str, tuple[QueueMeta, asyncio.Future[None]]] = {}
        """Replicas being created (their definition being written), by queue name: done
        when hosted (``create_replica``)."""

    def open_storage(self) -> tuple[NodeStorage, list[QueueMeta], dict[str, Sleeper]]:
        """In a worker, which owns the storage until ``start`` takes it over: take the
        records of the queues that slept at the last clean stop (before anything writes:
        ``engine.runtime.sleepers``), recover the storage, flush what the WAL holds, read
        the queue definitions, drop orphans."""
        ctx = self.ctx
        disk = OsDisk(str(ctx.data_dir))
        sleepers = take_sleepers(disk)
        storage = NodeStorage.open(disk, ctx.limits)
        error = storage.flush_segments()
        if error is not None:  # nothing is lost: the WAL files stay until a later flush
            log.error("start: segment flush failed: %s", error.detail)
        metas = self.read_metas(storage.disk)
        self.drop_orphans(storage, {m.uid for m in metas})
        return storage, metas, sleepers

    def read_metas(self, disk: Disk) -> list[QueueMeta]:
        metas = []
        for uid in disk.listdir("queues"):
            meta = read_meta(disk, uid)
            if meta is not None:
                metas.append(meta)
            elif disk.exists(meta_path(uid)):
                # Unreadable, not absent: keep the data for an operator, serve nothing.
                log.error("queue directory %s: definition unreadable, left alone", uid)
                self.unreadable.add(uid)
        return sorted(metas, key=lambda m: m.name)

    def drop_orphans(self, storage: NodeStorage, uids: set[str]) -> None:
        """Directories and logs without a definition are remains of a deleted queue (the
        definition is removed first and written first)."""
        keep = uids | self.unreadable | {META_UID}
        for uid in storage.servers():
            if uid not in keep:
                storage.remove_server(uid)  # the WAL writer is not running yet
        for uid in storage.disk.listdir("queues"):
            if uid not in keep:
                shutil.rmtree(self.ctx.data_dir / "queues" / uid, ignore_errors=True)

    def queues(self) -> list[QueueInfo]:
        """The queues hosted here and, on a cluster node, the live queues it serves by
        forwarding (``engine.runtime.forwarding``), by name."""
        ctx = self.ctx
        metas = [rep.meta for rep in ctx.replicas.values()]
        metas += [meta for meta, _e in ctx.failed.values()]
        infos = [queue_info(m) for m in metas]
        infos += [
            QueueInfo(rec.name, rec.uid, args_of(rec), rec.created_at_ms)
            for rec in ctx.forwarder.remotes()
        ]
        return sorted(infos, key=lambda q: q.name)

    async def create_queue(self, name: str, args: QueueArgs) -> tuple[QueueInfo, bool]:
        ctx = self.ctx
        check_queue_name(name)
        nodes = ctx.transport.nodes()
        args = check_args(args, ctx.limits, len(nodes))
        if ctx.meta_group is not None:
            return await self.registry.create_queue(name, args)
        async with ctx.admit():
            existing = self.known(name)
            if existing is not None:
                info = self.same_or_conflict(existing, args)
                await self.ensure_replicas(existing)
                return info, False
            assert args.replicas is not None
            start = nodes.index(ctx.name)
            members = tuple(sorted((nodes[start:] + nodes[:start])[: args.replicas]))
            meta = queue_meta(name, uuid.uuid4().hex, args, ctx.clock.wall_ms(), members)
            for member in members:
                if member == ctx.name:
                    await self.create_replica(meta)
                else:
                    await ctx.transport.call(NodeName(member), CreateReplica(meta))
            rep = ctx.replicas.get(name)
            if rep is not None:
                with contextlib.suppress(NoLeader):
                    await ctx.router.leader_node(rep)
                # Ready to serve once the first leader's no-op entry applied here.
                loop = ctx.loop
                deadline = loop.time() + ctx.limits.leader_wait_ms / 1000
                while rep.applied_index == 0 and loop.time() < deadline and not rep.closed:
                    await asyncio.sleep(ctx.limits.poll_interval_ms / 1000)
            return queue_info(meta), True

    async def ensure_replicas(self, meta: QueueMeta) -> None:
        """A create that failed half-way (a member was down) is completed by its retry."""
        ctx = self.ctx
        for member in meta.members:
            if member != ctx.name:
                with contextlib.suppress(NoLeader):
                    await ctx.transport.call(NodeName(member), CreateReplica(meta))

    def known(self, name: str) -> QueueMeta | None:
        ctx = self.ctx
        rep = ctx.replicas.get(name)
        if rep is not None:
            return rep.meta
        failed = ctx.failed.get(name)
        return failed[0] if failed else None

    @staticmethod
    def same_or_conflict(meta: QueueMeta, args: QueueArgs) -> QueueInfo:
        if meta.args != args:
            raise QueueConflict(f"queue {meta.name} exists with other arguments")
        return queue_info(meta)

    async def create_replica(self, meta: QueueMeta) -> None:
        """Write the definition, then host the replica. The lock covers the checks and
        the reservation of the name only: the definition's fsyncs of several creates run
        at once (one at a time, creating 10,000 queues waited 10,000 times for them)."""
        ctx = self.ctx
        while True:
            async with ctx.create_lock:
                reserved = self.reserve(meta)
            if not isinstance(reserved, asyncio.Future):
                break
            await asyncio.shield(reserved)  # the same replica, being created: look again
        if not reserved:
            return
        done = self.creating[meta.name][1]
        try:
            await asyncio.to_thread(write_meta, ctx.storage.disk, meta)
            rep = ctx.hosting.host(meta)
            ctx.hosting.schedule(rep)
        finally:
            del self.creating[meta.name]
            done.set_result(None)

    def reserve(self, meta: QueueMeta) -> bool | asyncio.Future[None]:
        """Reserve ``meta``'s name for its creation (True); False if the replica exists;
        the creation of the same replica under way, to wait for."""
        ctx = self.ctx
        creating = self.creating.get(meta.name)
        known = self.known(meta.name) if creating is None else creating[0]
        if known is not None:
            if known.uid != meta.uid:
                raise QueueConflict(f"queue {meta.name} exists on {ctx.name}")
            return False if creating is None else creating[1]
        if len(ctx.replicas) + len(self.creating) >= ctx.limits.queues_per_node_max:
            raise ValidationFailed(f"a node hosts at most {ctx.limits.queues_per_node_max} queues")
        self.creating[meta.name] = (meta, ctx.loop.create_future())
        return True

    async def delete_queue(self, name: str) -> None:
        ctx = self.ctx
        if ctx.meta_group is not None:
            await self.registry.delete_queue(name)
            return
        async with ctx.admit():
            meta = self.known(name)
            if meta is None:
                raise QueueNotFound(f"no queue {name}")
            for member in meta.members:
                if member == ctx.name:
                    await self.delete_replica(meta.uid)
                else:
                    with contextlib.suppress(NoLeader, QueueNotFound):
                        await ctx.transport.call(NodeName(member), DeleteReplica(meta.uid))

    async def delete_replica(self, uid: str) -> None:
        ctx = self.ctx
        rep = ctx.by_uid.pop(uid, None)
        if rep is not None:
            ctx.replicas.pop(rep.name, None)
            ctx.hosting.close_replica(rep, QueueNotFound(f"queue {rep.name} was deleted"))
            if rep.meta_task is not None:  # a definition being written: removed after it
                await asyncio.wait([rep.meta_task])
        ctx.pages.forget(uid)
        for name, (meta, _e) in list(ctx.failed.items()):
            if meta.uid == uid:
                del ctx.failed[name]
        storage = ctx.storage
        # The definition goes first: a crash after it leaves an orphan, removed at start.
        # Storage then removes the directory itself, which must hold none of our files.
        # A second delete of the same replica (a member removal racing the reconcile loop)
        # may remove the file between the check and the removal: gone is what both want.
        for path in (meta_path(uid), meta_path(uid) + ".tmp"):
            if storage.disk.exists(path):
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(storage.disk.remove, path)
        if storage.disk.exists(f"queues/{uid}"):
            await asyncio.to_thread(storage.disk.sync_dir, f"queues/{uid}")
        removed: asyncio.Future[None] = ctx.loop.create_future()
        ctx.removed[uid] = removed
        self.forget_storage(uid)
        try:
            await asyncio.wait_for(removed, ctx.limits.proposal_timeout_ms / 1000)
        except TimeoutError:
            log.warning("queue %s: removal not confirmed by storage yet", uid)
        finally:
            ctx.removed.pop(uid, None)

    def forget_storage(self, uid: str) -> None:
        """Drop server ``uid`` from storage: a forget record goes through the WAL, then
        storage deletes its files (finished at recovery after a crash)."""
        ctx = self.ctx
        ctx.storage.remove_server(uid)
        if ctx.writer is not None:
            ctx.writer.wake()

    async def update_policy(self, name: str, changes: dict[str, object]) -> QueueInfo:
        ctx = self.ctx
        remote = ctx.forwarder.remote(name)
        args = ctx.replica(name).meta.args if remote is None else args_of(remote)
        args_with(args, changes, ctx.limits)
        async with ctx.admit():
            result = await ctx.router.route(UpdatePolicyCall(name, changes))
        assert isinstance(result, QueueInfo)
        return result

    async def update_policy_local(self, rep: Replica, changes: dict[str, object]) -> QueueInfo:
        args_with(rep.meta.args, changes, self.ctx.limits)
        reply = await self.ctx.propose(rep, encode_policy(changes))
        assert isinstance(reply, PolicyChanged), reply
        await self.registry.record_policy(rep)  # a cluster's metadata follows the log
        return queue_info(rep.meta)

    def policy_changed(self, rep: Replica) -> None:
        policy = rep.machine.policy
        changes = {name: getattr(policy, name) for name in policy.to_wire()}
        args = dataclasses.replace(rep.meta.args, **changes)
        rep.meta = dataclasses.replace(rep.meta, args=args)
        self.write_meta(rep)

    def write_meta(self, rep: Replica) -> None:
        """Write the replica's definition after a change (policy, members), so that a
        later start lists it: in a worker, one write at a time per replica, the newest
        definition last. A stop waits for it (a job); a deletion too, before it removes
        the file."""
        if rep.meta_task is None:
            rep.meta_task = self.ctx.loop.create_task(self.write_metas(rep))

    async def write_metas(self, rep: Replica) -> None:
        ctx = self.ctx
        disk = ctx.storage.disk
        written: QueueMeta | None = None
        try:
            async with ctx.job():
                # A deleted replica is no longer in ``by_uid``: its file stays removed.
                while rep.meta is not written and ctx.by_uid.get(rep.uid) is rep:
                    written = rep.meta
                    await ctx.in_worker(write_meta, disk, written)
        except OSError as e:
            log.error("queue %s: definition not written: %s", rep.name, e)
        finally:
            rep.meta_task = None


def queue_info(meta: QueueMeta) -> QueueInfo:
    return QueueInfo(meta.name, meta.uid, meta.args, meta.created_at_ms)


__all__ = ["Catalog", "queue_info"]
