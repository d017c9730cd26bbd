"""``quorra sim --seeds N [--first-seed S] [--steps M] [--servers 3|5] [--damage] [--workload W]``.

The workload ``W`` is the key-value register (``kv``, checked for linearizability), the
queue machine (``queue``: ``engine.sim.queue_workload``) or the cluster metadata with
every node's reconcile loop (``meta``: ``engine.sim.meta_workload``).

With ``--damage`` (kv only) every server runs the real storage on a fake disk, and bits
are flipped in one replica's files at a time (WAL, segments, checkpoints): the run also
checks that the damaged replica is repaired from the others.

Prints one line per failing seed with the last lines of its trace, then ``N passed, N
failed``; exits 1 on any failure. Re-run one seed with ``--seeds 1 --first-seed S``.
"""

from __future__ import annotations

import argparse
import sys
import time

from engine.raft.server import Fault
from engine.sim.meta_workload import run_meta_seed
from engine.sim.queue_workload import run_queue_seed
from engine.sim.run import SeedResult, run_seed


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="quorra sim", description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=100, help="how many seeds to run")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed")
    p.add_argument("--steps", type=int, default=3000, help="simulated events per seed")
    p.add_argument("--servers", type=int, choices=(3, 5), default=3)
    p.add_argument(
        "--fault",
        choices=[f.name.lower() for f in Fault],
        default="none",
        help="run with a deliberate bug (to see the checkers catch it)",
    )
    p.add_argument("--trace-lines", type=int, default=12, help="trace lines per failure")
    p.add_argument("--damage", action="store_true", help="damage disks (real storage)")
    p.add_argument(
        "--workload",
        choices=("kv", "queue", "meta"),
        default="kv",
        help="what the clients drive (--fault and --damage: kv only)",
    )
    return p


def _run(args: argparse.Namespace, seed: int, fault: Fault) -> SeedResult:
    if args.workload == "queue":
        return run_queue_seed(seed, steps=args.steps, servers=args.servers)
    if args.workload == "meta":
        return run_meta_seed(seed, steps=args.steps, servers=args.servers)
    return run_seed(
        seed, steps=args.steps, servers=args.servers, fault=fault, corrupt_disks=args.damage
    )


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    fault = Fault[args.fault.upper()]
    if args.workload != "kv" and (args.damage or fault is not Fault.NONE):
        parser.error("--fault and --damage run with the kv workload")
    passed = failed = 0
    started = time.perf_counter()
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        result = _run(args, seed, fault)
        if result.passed:
            passed += 1
            continue
        failed += 1
        print(
            f"seed {seed} FAILED after {result.steps} steps ({result.sim_ms} ms simulated): "
            f"{result.violations[0]}"
        )
        for line in result.trace[-args.trace_lines :]:
            print(f"    {line}")
    elapsed = time.perf_counter() - started
    print(f"{passed} passed, {failed} failed ({elapsed:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
