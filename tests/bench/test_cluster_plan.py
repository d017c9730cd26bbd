"""``bench cluster``'s load phases: which run, through which node, with what spec; and
``--paced-only``, the paced publish alone."""

from __future__ import annotations

from bench import cluster


def plan(*argv: str) -> dict[str, tuple[str, dict[str, object]]]:
    args = cluster.arguments(list(argv))
    return cluster.phase_plan(args, "n2", "n3")


def test_a_full_run_has_every_phase_the_paced_one_last_through_the_leader() -> None:
    phases = plan("--rate", "500")
    assert list(phases) == [
        "publish_leader",
        "publish_follower",
        "consume_leader",
        "consume_follower",
        "publish_paced",
    ]
    assert [via for via, _ in phases.values()] == ["n2", "n3", "n2", "n3", "n2"]
    spec = phases["publish_paced"][1]
    assert spec["kind"] == "paced" and spec["batch"] == 1 and spec["rate"] == 500.0


def test_paced_only_runs_the_paced_publish_through_the_leader_alone() -> None:
    phases = plan("--paced-only", "--rate", "250")
    assert list(phases) == ["publish_paced"]
    via, spec = phases["publish_paced"]
    assert via == "n2"
    assert spec == {
        "queue": cluster.QUEUE,
        "batch": 1,
        "clients": 1,
        "kind": "paced",
        "rate": 250.0,
    }
