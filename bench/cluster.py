"""Throughput, latency, failover and catch-up of a three-node cluster of real processes.

``quorra bench cluster [--json] [--quick] [--seconds S] [--procs P] [--kills K]
[--catch-up-messages N] [--paced-only]``: starts three ``quorra serve`` processes of one cluster on
127.0.0.1 (temporary data directories, free ports, the cluster flags of ``quorra
dev-cluster``), creates a queue with 3 replicas, and drives it with the load generators of
``bench rest`` (1 KiB messages, JSON bodies, separate processes):

* publish through the queue's leader and through a follower (batches of 100,
  ``--batch-clients`` per generator), consume (receive up to 100, then ack) through each;
* a paced publish at ``--rate`` msgs/s through the leader: p50 and p99 from the due time;
* the same batch publish on a single-node server, started after the cluster is stopped,
  for the ratio the target is set against;
* ``--kills`` failovers: ``kill -9`` of the queue's leader, then publishes of one message
  (each with a ``dedup_id``) through the other nodes in turn, each request bounded by
  ``FAILOVER_REQUEST_S``, until one is confirmed (201): the time from the kill to that
  confirm; the killed node is restarted and waited for (caught up) before the next kill,
  except the last one, which stays down for the catch-up;
* catch-up: with the node killed last still down (a follower is killed when none is),
  ``--catch-up-messages`` messages are published, the node restarted, and the time from its
  exec until the leader counts it within ``CAUGHT_UP_LAG_MAX`` entries is taken (it may
  come by snapshot when compaction moved on).

``--paced-only`` runs the paced phase alone (after the cluster's start and the queue's
creation): no batch phases, failovers, catch-up or single node, whose figures are then
null; a short run for the cost of a one-message entry.

Every message confirmed during the failovers is then received from the queue: one that is
missing is counted in ``lost_messages`` (a confirmed message must survive any kill).
Three processes and the generators share this machine's cores: ``phases`` gives each
phase's CPU seconds per wall second summed over the three servers
(``server_cpu_per_wall``) and over the generators (``client_cpu_per_wall``), so a rate can be
read against what the processes could get, and each server's CPU microseconds per message
(``server_cpu_us_per_msg_by_node``, the queue's leader at the phase's start in
``leader_before``).

JSON keys (``JSON_KEYS``; the headline is ``failover_ms``):

* ``bench``: "cluster";
* ``machine``: ``bench.machine_info()`` at the start (load average, CPU governor);
* ``nodes``: processes in the cluster (3);
* ``replicas``: members of the queue's Raft group (3);
* ``message_bytes``: bytes per message body (1024);
* ``publish_msgs_per_s``: batches of 100 through the leader, confirmed on a quorum;
* ``publish_via_follower_msgs_per_s``: the same through a follower (forwarded);
* ``consume_msgs_per_s``: received and acked per second through the leader;
* ``consume_via_follower_msgs_per_s``: the same through a follower;
* ``publish_p50_ms``: median latency of a paced publish at ``--rate`` through the leader;
* ``publish_p99_ms``: its 99th percentile;
* ``paced_rate_msgs_per_s``: the rate asked for;
* ``paced_server_cpu_us_per_msg``: the same split (``cpu_split``) for the paced publish, a
  one-message entry each, against ``single_node`` null;
* ``publish_server_cpu_us_per_msg``: CPU microseconds per message of the publish
  through the leader, split by server (``cpu_split``): ``leader``, ``followers`` (each, by
  node name), ``all`` (their sum), and ``single_node`` (the single-node server's, for
  comparison): what replication costs each process;
* ``single_node_publish_msgs_per_s``: batches of 100 on a single-node server;
* ``publish_ratio_to_single_node``: ``publish_msgs_per_s`` over that;
* ``failover_ms``: the headline: median over the kills, kill -9 of the leader to the first
  publish confirmed through another node (null with ``--kills 0``);
* ``failover_ms_max``: the slowest of them;
* ``failover_runs_ms``: each kill's figure;
* ``catch_up_s``: a follower restarted ``catch_up_messages`` behind, exec to caught up;
* ``catch_up_messages``: how far behind it was;
* ``lost_messages``: confirmed messages not received afterwards (must be 0);
* ``seconds_per_phase``: length of each load phase;
* ``load_procs``: load-generator processes per phase;
* ``phases``: every load phase's figures (counts, errors, CPU), the node it went
  through (``via``) and the queue's leader after it (``leader_after``);
* ``targets``: what the figures are held to.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

import bench
from app import dev_cluster
from app.ports import free_port
from bench import rest

JSON_KEYS = (
    "bench",
    "machine",
    "nodes",
    "replicas",
    "message_bytes",
    "publish_msgs_per_s",
    "publish_via_follower_msgs_per_s",
    "consume_msgs_per_s",
    "consume_via_follower_msgs_per_s",
    "publish_p50_ms",
    "publish_p99_ms",
    "publish_server_cpu_us_per_msg",
    "paced_rate_msgs_per_s",
    "paced_server_cpu_us_per_msg",
    "single_node_publish_msgs_per_s",
    "publish_ratio_to_single_node",
    "failover_ms",
    "failover_ms_max",
    "failover_runs_ms",
    "catch_up_s",
    "catch_up_messages",
    "lost_messages",
    "seconds_per_phase",
    "load_procs",
    "phases",
    "targets",
)
HEADLINE_KEY = "failover_ms"
NODES = 3
QUEUE = "bench-cluster"
FAILOVER_QUEUE = "bench-failover"
WAIT_S = 60.0
"""How long a start, a leader or a catch-up may take before the bench gives up."""
POLL_S = 0.02
FAILOVER_REQUEST_S = 0.5
"""A publish during a failover gives up after this long and tries the next node."""
CAUGHT_UP_LAG_MAX = 20
FILL_BATCH = 500
QUICK_SECONDS = 1.0
QUICK_START_DELAY_S = 0.5
"""The smoke run's generators start this long after their spawn: one that is not ready
by then measures its own window from when it is (``bench.rest``'s generators)."""
QUICK_CATCH_UP_MESSAGES = 5_000


def _polls(what: str, timeout_s: float = WAIT_S) -> Iterator[None]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        yield
        time.sleep(POLL_S)
    raise RuntimeError(f"no {what} within {timeout_s} s")


class ClusterProcesses:
    """Three ``quorra serve`` of one cluster, started as ``quorra dev-cluster`` starts
    them, on free ports; a bearer token per node (each made on its node)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.nodes = [
            dev_cluster.DevNode(f"n{k}", free_port(), free_port(), root / f"n{k}")
            for k in range(1, NODES + 1)
        ]
        secret = root / "cluster.secret"
        secret.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
        secret.chmod(0o600)
        self.env = dev_cluster.environment(root, rest.ADMIN_PASSWORD)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tokens: dict[str, str] = {}

    def node(self, name: str) -> dev_cluster.DevNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, name: str) -> float:
        """Exec ``name``; returns the monotonic time of the exec."""
        node = self.node(name)
        log = (self.root / f"{name}.log").open("ab")
        started = time.monotonic()
        command = dev_cluster.command(node, self.nodes)
        self.procs[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=self.env
        )
        log.close()
        return started

    def start_all(self) -> None:
        for node in self.nodes:
            self.start(node.name)
        for node in self.nodes:
            self.wait_ready(node.name)

    def wait_ready(self, name: str) -> None:
        url = self.node(name).url
        for _ in _polls(f"{name} ready"):
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} exited: {self.log_tail(name)}")
            try:
                if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass

    def kill9(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def live(self) -> list[str]:
        return [n.name for n in self.nodes if n.name in self.procs]

    def cpu_s(self) -> float:
        """User + system CPU seconds of every live server (``bench.rest.CpuClock``)."""
        return sum(self.cpu_by_node().values())

    def cpu_by_node(self) -> dict[str, float]:
        """User + system CPU seconds of each live server, by node name."""
        by_node: dict[str, float] = {}
        for name, proc in self.procs.items():
            with open(f"/proc/{proc.pid}/stat", encoding="ascii") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            by_node[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return by_node

    def log_tail(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]

    def token(self, name: str) -> str:
        if name not in self.tokens:
            url = self.node(name).url
            for _ in _polls(f"token on {name}"):
                try:
                    made = httpx.post(
                        f"{url}/api/v1/tokens", auth=("admin", rest.ADMIN_PASSWORD), timeout=5.0
                    )
                except httpx.TransportError:
                    continue
                if made.status_code in (200, 201):
                    self.tokens[name] = made.json()["token"]
                    break
        return self.tokens[name]

    def client(self, name: str, timeout_s: float = 10.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token(name)}"}
        return httpx.Client(base_url=self.node(name).url, headers=headers, timeout=timeout_s)

    def raft(self, queue: str, via: str) -> dict[str, Any] | None:
        try:
            with self.client(via, 2.0) as c:
                answer = c.get(f"/api/v1/queues/{queue}")
        except httpx.TransportError:
            return None
        if answer.status_code != 200:
            return None
        raft: dict[str, Any] = answer.json()["stats"]["raft"]
        return raft

    def leader(self, queue: str) -> str:
        for _ in _polls(f"leader of {queue}"):
            for via in self.live():
                raft = self.raft(queue, via)
                leader = raft and raft.get("leader")
                if leader in self.live():
                    return str(leader)
        raise AssertionError("unreachable")

    def wait_caught_up(self, queue: str, name: str, timeout_s: float = WAIT_S) -> None:
        for _ in _polls(f"{name} caught up on {queue}", timeout_s):
            leader = self.leader(queue)
            raft = self.raft(queue, leader)
            lags = [m.get("lag") for m in (raft or {}).get("members", []) if m["node"] == name]
            if lags and lags[0] is not None and lags[0] <= CAUGHT_UP_LAG_MAX:
                return

    def create_queue(self, queue: str) -> None:
        for _ in _polls(f"queue {queue} created"):
            try:
                with self.client("n1") as c:
                    answer = c.put(f"/api/v1/queues/{queue}", json={"replicas": NODES})
            except httpx.TransportError:
                continue
            if answer.status_code in (200, 201):
                return
            if answer.status_code != 503:
                raise RuntimeError(f"create {queue}: {answer.status_code} {answer.text}")


# --- the measurements ------------------------------------------------------------------


class NodeClocks:
    """The ``bench.rest.CpuClock`` of a phase: the cluster's CPU seconds, each server's
    kept at every reading (``run_phase`` reads at the phase's start and end)."""

    def __init__(self, cluster: ClusterProcesses) -> None:
        self.cluster = cluster
        self.readings: list[dict[str, float]] = []

    def cpu_s(self) -> float:
        by_node = self.cluster.cpu_by_node()
        self.readings.append(by_node)
        return sum(by_node.values())

    def us_per_msg(self, messages: int) -> dict[str, float | None]:
        """Each server's CPU microseconds per message between the first and last reading
        (None for one that was not up at both)."""
        first, last = self.readings[0], self.readings[-1]
        return {
            name: round((last[name] - first[name]) * 1e6 / messages, 1)
            if messages and name in last
            else None
            for name in first
        }


def cpu_split(
    by_node: dict[str, float | None], leader: str, single_node: float | None
) -> dict[str, Any]:
    """A phase's ``server_cpu_us_per_msg_by_node`` as the leader's, each follower's, their
    sum and the single node's (``publish_server_cpu_us_per_msg``)."""
    known = [v for v in by_node.values() if v is not None]
    return {
        "leader": by_node.get(leader),
        "followers": {n: v for n, v in sorted(by_node.items()) if n != leader},
        "all": round(sum(known), 1) if len(known) == len(by_node) else None,
        "single_node": single_node,
    }


def _phase(
    cluster: ClusterProcesses, via: str, spec: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    node = cluster.node(via)
    base = rest.server_spec(node.url, cluster.token(via), args.seconds)
    delay_s = QUICK_START_DELAY_S if args.quick else rest.START_DELAY_S
    leader = cluster.leader(QUEUE)
    clocks = NodeClocks(cluster)
    phase = rest.run_phase(clocks, base | spec, args.procs, delay_s)
    phase["server_cpu_us_per_msg_by_node"] = clocks.us_per_msg(phase["messages"])
    phase["via"] = via
    phase["leader_before"] = leader
    # Which node led the queue once the phase was over: a "leader" phase whose via is not
    # it measured forwarded publishes (a stale answer, or leadership moved under load).
    phase["leader_after"] = cluster.leader(QUEUE)
    return phase


def phase_plan(
    args: argparse.Namespace, leader: str, follower: str
) -> dict[str, tuple[str, dict[str, Any]]]:
    """The load phases to run, in order: each one's name, the node it goes through and
    its spec (``bench.rest.run_phase``); only the paced one with ``--paced-only``."""
    batch = {"queue": QUEUE, "batch": 100, "clients": args.batch_clients}
    paced = {"queue": QUEUE, "batch": 1, "clients": 1, "kind": "paced", "rate": args.rate}
    if args.paced_only:
        return {"publish_paced": (leader, paced)}
    return {
        "publish_leader": (leader, batch | {"kind": "publish"}),
        "publish_follower": (follower, batch | {"kind": "publish"}),
        "consume_leader": (leader, batch | {"kind": "consume"}),
        "consume_follower": (follower, batch | {"kind": "consume"}),
        "publish_paced": (leader, paced),
    }


def load_phases(cluster: ClusterProcesses, args: argparse.Namespace) -> dict[str, Any]:
    leader = cluster.leader(QUEUE)
    follower = next(n for n in cluster.live() if n != leader)
    plan = phase_plan(args, leader, follower)
    return {name: _phase(cluster, via, spec, args) for name, (via, spec) in plan.items()}


def _publish_one(cluster: ClusterProcesses, via: str, body: str) -> bool:
    """One message with ``body`` as its dedup id; whether it was confirmed."""
    message = {"messages": [{"body": body, "dedup_id": body}]}
    try:
        with cluster.client(via, FAILOVER_REQUEST_S) as c:
            answer = c.post(f"/api/v1/queues/{FAILOVER_QUEUE}/messages", json=message)
    except httpx.TransportError:
        return False
    return answer.status_code == 201


def failovers(cluster: ClusterProcesses, kills: int, confirmed: set[str]) -> list[float]:
    """``kills`` times: kill -9 the leader, time the first confirmed publish elsewhere,
    restart the killed node and wait for it; the bodies confirmed go into ``confirmed``.
    The node killed last is left down: ``catch_up`` restarts it (one start fewer)."""
    runs: list[float] = []
    for k in range(kills):
        leader = cluster.leader(FAILOVER_QUEUE)
        warm = f"before-{k}"
        if _publish_one(cluster, leader, warm):
            confirmed.add(warm)
        cluster.kill9(leader)
        killed_at = time.monotonic()
        others = cluster.live()
        for attempt, _ in enumerate(_polls(f"a publish confirmed after kill {k}")):
            body = f"kill-{k}-{attempt}"
            via = others[attempt % len(others)]
            if _publish_one(cluster, via, body):
                confirmed.add(body)
                runs.append(round((time.monotonic() - killed_at) * 1000, 1))
                break
        if k < kills - 1:
            cluster.start(leader)
            cluster.wait_ready(leader)
            cluster.wait_caught_up(FAILOVER_QUEUE, leader)
    return runs


def lost(cluster: ClusterProcesses, confirmed: set[str]) -> int:
    """Receive every message of the failover queue: how many confirmed ones are missing."""
    seen: set[str] = set()
    with cluster.client(cluster.leader(FAILOVER_QUEUE)) as c:
        while True:
            answer = c.post(
                f"/api/v1/queues/{FAILOVER_QUEUE}/messages/receive",
                json={"max_messages": 100, "wait_ms": 200},
            )
            answer.raise_for_status()
            messages = answer.json()["messages"]
            if not messages:
                break
            seen.update(m["body"] for m in messages)
            receipts = [m["receipt"] for m in messages]
            c.post(f"/api/v1/queues/{FAILOVER_QUEUE}/messages/ack", json={"receipts": receipts})
    return len(confirmed - seen)


def catch_up(cluster: ClusterProcesses, messages: int) -> float:
    """Seconds from the exec of a follower left ``messages`` behind to caught up: the node
    still down from ``failovers``, or a follower killed here when every node is up."""
    down = [n.name for n in cluster.nodes if n.name not in cluster.procs]
    leader = cluster.leader(QUEUE)
    if down:
        follower = down[0]
    else:
        follower = next(n for n in cluster.live() if n != leader)
        cluster.kill9(follower)
    body = "x" * rest.MESSAGE_BYTES
    with cluster.client(leader, 30.0) as c:
        for start in range(0, messages, FILL_BATCH):
            count = min(FILL_BATCH, messages - start)
            answer = c.post(
                f"/api/v1/queues/{QUEUE}/messages", json={"messages": [{"body": body}] * count}
            )
            answer.raise_for_status()
    started = cluster.start(follower)
    cluster.wait_ready(follower)
    cluster.wait_caught_up(QUEUE, follower, timeout_s=10 * WAIT_S)
    return round(time.monotonic() - started, 2)


def single_node_publish(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    root.mkdir()
    server = rest.ServerProcess(root / "data", None)
    server.start()
    try:
        token = _single_node_setup(server.url)
        base = rest.server_spec(server.url, token, args.seconds)
        spec = {"queue": QUEUE, "batch": 100, "clients": args.batch_clients, "kind": "publish"}
        delay_s = QUICK_START_DELAY_S if args.quick else rest.START_DELAY_S
        return rest.run_phase(server, base | spec, args.procs, delay_s)
    finally:
        server.stop()


def _single_node_setup(url: str) -> str:
    made = httpx.post(f"{url}/api/v1/tokens", auth=("admin", rest.ADMIN_PASSWORD), timeout=30.0)
    made.raise_for_status()
    token: str = made.json()["token"]
    headers = {"Authorization": f"Bearer {token}"}
    httpx.put(f"{url}/api/v1/queues/{QUEUE}", headers=headers, timeout=30.0).raise_for_status()
    return token


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 2)


def measure(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    cluster = ClusterProcesses(root / "cluster")
    confirmed: set[str] = set()
    try:
        cluster.start_all()
        for queue in (QUEUE, FAILOVER_QUEUE):
            cluster.create_queue(queue)
        phases = load_phases(cluster, args)
        if not args.paced_only:
            runs = failovers(cluster, args.kills, confirmed)
            lost_messages = lost(cluster, confirmed)
            catch_up_s = catch_up(cluster, args.catch_up_messages)
    except BaseException:
        for name in cluster.live():
            print(f"--- {name}\n{cluster.log_tail(name)}", file=sys.stderr)
        raise
    finally:
        cluster.stop()
    paced = phases["publish_paced"].pop("latencies_ms")
    paced_split = cpu_split(
        phases["publish_paced"]["server_cpu_us_per_msg_by_node"],
        phases["publish_paced"]["leader_before"],
        None,
    )
    if args.paced_only:
        return paced_only_report(args, phases, paced, paced_split)
    single = single_node_publish(root / "single", args)
    for phase in phases.values():
        phase.pop("latencies_ms", None)
    publish = phases["publish_leader"]["msgs_per_s"]
    return {
        "nodes": NODES,
        "replicas": NODES,
        "message_bytes": rest.MESSAGE_BYTES,
        "publish_msgs_per_s": publish,
        "publish_via_follower_msgs_per_s": phases["publish_follower"]["msgs_per_s"],
        "consume_msgs_per_s": phases["consume_leader"]["msgs_per_s"],
        "consume_via_follower_msgs_per_s": phases["consume_follower"]["msgs_per_s"],
        "publish_p50_ms": _percentile(paced, 0.50),
        "publish_p99_ms": _percentile(paced, 0.99),
        "publish_server_cpu_us_per_msg": cpu_split(
            phases["publish_leader"]["server_cpu_us_per_msg_by_node"],
            phases["publish_leader"]["leader_before"],
            single["server_cpu_us_per_msg"],
        ),
        "paced_rate_msgs_per_s": args.rate,
        "paced_server_cpu_us_per_msg": paced_split,
        "single_node_publish_msgs_per_s": single["msgs_per_s"],
        "publish_ratio_to_single_node": round(publish / single["msgs_per_s"], 3),
        "failover_ms": statistics.median(runs) if runs else None,
        "failover_ms_max": max(runs) if runs else None,
        "failover_runs_ms": runs,
        "catch_up_s": catch_up_s,
        "catch_up_messages": args.catch_up_messages,
        "lost_messages": lost_messages,
        "seconds_per_phase": args.seconds,
        "load_procs": args.procs,
        "phases": phases | {"single_node_publish": _without_latencies(single)},
        "targets": {
            "failover_ms": 1000,
            "failover_ms_max": 2000,
            "publish_ratio_to_single_node": 0.6,
            "lost_messages": 0,
        },
    }


def paced_only_report(
    args: argparse.Namespace,
    phases: dict[str, Any],
    paced: list[float],
    paced_split: dict[str, Any],
) -> dict[str, Any]:
    """``measure``'s figures with ``--paced-only``: the paced phase's, every other null."""
    return {
        "nodes": NODES,
        "replicas": NODES,
        "message_bytes": rest.MESSAGE_BYTES,
        "publish_msgs_per_s": None,
        "publish_via_follower_msgs_per_s": None,
        "consume_msgs_per_s": None,
        "consume_via_follower_msgs_per_s": None,
        "publish_p50_ms": _percentile(paced, 0.50),
        "publish_p99_ms": _percentile(paced, 0.99),
        "publish_server_cpu_us_per_msg": None,
        "paced_rate_msgs_per_s": args.rate,
        "paced_server_cpu_us_per_msg": paced_split,
        "single_node_publish_msgs_per_s": None,
        "publish_ratio_to_single_node": None,
        "failover_ms": None,
        "failover_ms_max": None,
        "failover_runs_ms": [],
        "catch_up_s": None,
        "catch_up_messages": 0,
        "lost_messages": None,
        "seconds_per_phase": args.seconds,
        "load_procs": args.procs,
        "phases": phases,
        "targets": {},
    }


def _without_latencies(phase: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in phase.items() if k != "latencies_ms"}


def arguments(argv: list[str]) -> argparse.Namespace:
    """The command line of ``quorra bench cluster`` (``--quick`` applied)."""
    parser = bench.parser("cluster", __doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each load phase")
    parser.add_argument("--procs", type=int, default=2, help="load-generator processes")
    parser.add_argument("--batch-clients", type=int, default=4, help="per process, batches of 100")
    parser.add_argument("--rate", type=float, default=1000.0, help="paced publishes per second")
    parser.add_argument("--kills", type=int, default=5, help="leader kills for failover_ms")
    parser.add_argument(
        "--catch-up-messages", type=int, default=1_000_000, help="how far a follower falls behind"
    )
    parser.add_argument(
        "--paced-only",
        action="store_true",
        help="only the paced publish through the leader; the other figures are null",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.procs, args.kills = QUICK_SECONDS, 1, 1
        args.catch_up_messages = QUICK_CATCH_UP_MESSAGES
    return args


def main(argv: list[str]) -> int:
    args = arguments(argv)
    report: Callable[[dict[str, Any]], str] = json.dumps if args.json else _indented
    header = bench.header("cluster")
    with tempfile.TemporaryDirectory(prefix="quorra-bench-cluster-") as tmp:
        result = header | measure(Path(tmp), args)
    print(report(result))
    return 0


def _indented(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2)
