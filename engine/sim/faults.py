"""The simulator's nemesis: the faults injected into a ``World`` at random times.

Rule: every few hundred simulated milliseconds the nemesis draws one fault from the
world's random generator, among those ``SimConfig`` allows: crash a server (restarted
later), partition the network (healed later), add or remove a member, transfer the
leadership, or rot a running server's segment data. Every choice is drawn from the
world's one ``random.Random``, in a fixed order, so a seed gives the same faults.

Damaged disks (``SimConfig.corrupt_disks``, with a storage that has a disk): a crashed
server's disk gets a flipped bit (WAL, segment data, index or header, checkpoint) before
it restarts, and a running server's segment data may rot. Damage hits one server's disk
per run, only while no server is repairing and the group has three voters or more, so
that a majority that can elect a leader and repair the damaged server always remains.
``stop`` ends the faults (the world's settling at the end of a run with damaged disks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.ids import ServerId
from engine.raft.events import AddServer, DemoteServer, Event, RemoveServer, TransferLeadership

if TYPE_CHECKING:
    from engine.sim.world import World


class Nemesis:
    """Draws and injects one world's faults."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.stopped = False
        self.damaged: dict[ServerId, list[str]] = {}
        """What was damaged on each server's disk, for the trace and the final check."""
        self.next_admin_request = 1 << 40
        """Request ids of the membership changes and transfers, apart from the clients'."""

    def start(self) -> None:
        self.world.schedule(self.world.rng.randint(200, 1000), self._strike)

    def stop(self) -> None:
        self.stopped = True

    def _strike(self) -> None:
        if self.stopped:
            return
        world = self.world
        world.schedule(world.rng.randint(200, 1200), self._strike)
        choice = world.rng.randrange(6)
        cfg = world.config
        if choice <= 1 and cfg.crashes:
            self._crash_one()
        elif choice == 2 and cfg.partitions:
            self._partition()
        elif choice == 3 and cfg.membership and cfg.servers > 1:
            self._reconfigure()
        elif choice == 4 and cfg.transfers and cfg.servers > 1:
            self._transfer()
        elif choice == 5 and cfg.corrupt_disks:
            self._rot()
        elif choice in (3, 4) and cfg.sleeps:
            self._sleep_and_wake()

    def _sleep_and_wake(self) -> None:
        """The lone server sleeps and wakes, if it is idle; then, one time in two, it
        crashes right after (restarted later), even with ``crashes`` off: the wake must
        have confirmed nothing it could lose, nor gone back in term. (With ``crashes``
        off a lone server crashes only so: one that crashes while its first campaign's
        term is not yet durable may lead that term again with another log.)"""
        world = self.world
        sid = world.ids[0]
        if not world.sleep_and_wake(sid) or world.rng.randrange(2):
            return
        world.schedule(world.rng.randint(0, 20), lambda: self._crash_after_wake(sid))

    def _crash_after_wake(self, sid: ServerId) -> None:
        world = self.world
        if world.nodes[sid].alive:
            world.crash(sid)
            world.schedule(world.rng.randint(50, 1500), lambda: world.restart(sid))

    def _crash_one(self) -> None:
        world = self.world
        alive = [n.id for n in world.live_nodes()]
        if not alive or (len(alive) <= len(world.ids) // 2 and len(world.ids) > 1):
            return  # a majority must stay up; a lone server may go down, not twice
        sid = world.rng.choice(alive)
        world.crash(sid)
        if world.config.corrupt_disks:
            self._corrupt(sid)
        world.schedule(world.rng.randint(50, 1500), lambda: world.restart(sid))

    def _corrupt(self, sid: ServerId) -> None:
        """Flip a bit on the crashed server's disk, if no server is repairing."""
        world = self.world
        if self._repairing() or not self._may_damage(sid):
            return
        leader = world.leader()
        if leader is None or len(leader.raft.config.voters) < 3:
            return  # of two voters, one repairing, neither could be elected
        hit = world.nodes[sid].storage.corrupt(world.rng)
        if hit is not None:
            self._record_damage(sid, hit)

    def _rot(self) -> None:
        """Flip a bit in a segment of a running server, if no server is repairing."""
        world = self.world
        alive = [n.id for n in world.live_nodes()]
        if self._repairing() or not alive:
            return
        sid = world.rng.choice(alive)
        leader = world.leader()
        if leader is None or len(leader.raft.config.voters) < 3 or not self._may_damage(sid):
            return
        hit = world.nodes[sid].storage.rot(world.rng)
        if hit is not None:
            self._record_damage(sid, hit)

    def _record_damage(self, sid: ServerId, hit: str) -> None:
        self.damaged.setdefault(sid, []).append(hit)
        self.world.log(f"damage {sid}: {hit}")

    def _may_damage(self, sid: ServerId) -> bool:
        """One server's disk is damaged per run: damage may lie unread (rot in a segment)
        until another server is damaged too, and then two of three could be repairing."""
        return not self.damaged or sid in self.damaged

    def _repairing(self) -> bool:
        """With damaged disks: whether a server is (or will restart) in repair."""
        world = self.world
        if not world.config.corrupt_disks:
            return False
        return any(n.raft.repairing or n.storage.repairing() for n in world.nodes.values())

    def _partition(self) -> None:
        world = self.world
        ids = list(world.ids)
        world.rng.shuffle(ids)
        cut = world.rng.randint(1, len(ids) - 1) if len(ids) > 1 else 1
        leader = world.leader()
        if leader is not None and world.rng.randrange(2):
            # Cut the leader off alone: the classic way to get a deposed leader.
            ids.remove(leader.id)
            ids.insert(0, leader.id)
            cut = 1
        groups = [sorted(ids[:cut]), sorted(ids[cut:])]
        world.network.partition(groups)
        world.log(f"partition {groups[0]} | {groups[1]}")
        world.schedule(world.rng.randint(100, 2000), self._heal)

    def _heal(self) -> None:
        self.world.network.heal()
        self.world.log("heal")

    def _reconfigure(self) -> None:
        world = self.world
        leader = world.leader()
        if leader is None:
            return
        config = leader.raft.config
        self.next_admin_request += 1
        outside = [s for s in world.ids if s not in config.members]
        event: Event
        if config.learners and world.rng.random() < 0.5:
            # A learner left by an addition that stopped at it, or added as one only.
            event = AddServer(self.next_admin_request, world.rng.choice(config.learners))
        elif outside:
            learner_only = world.rng.random() < 0.3
            event = AddServer(self.next_admin_request, outside[0], learner_only=learner_only)
        elif len(config.voters) >= 3 and not self._repairing():
            others = [v for v in config.voters if v != leader.id]
            if world.rng.random() < 0.3:
                # A voter becomes a learner (a drained metadata voter): it replicates on.
                event = DemoteServer(self.next_admin_request, world.rng.choice(others))
            else:
                event = RemoveServer(self.next_admin_request, world.rng.choice(config.members))
        else:
            return
        world.log(f"{leader.id} asked to {type(event).__name__} {event.server}")
        world.step(leader, event)

    def _transfer(self) -> None:
        world = self.world
        leader = world.leader()
        if leader is None:
            return
        others = [s for s in leader.raft.config.voters if s != leader.id]
        if others:
            self.next_admin_request += 1
            target = world.rng.choice(others)
            world.log(f"{leader.id} asked to transfer leadership to {target}")
            world.step(leader, TransferLeadership(self.next_admin_request, target))


__all__ = ["Nemesis"]
