"""The segment map of a queue's page (app/ui/reads.py, templates/_queue_storage.html): a
node with a replica shows its own segments; a cluster node without one shows its
leader's, saying whose; when the leader does not answer, the page says the map is not
here and where to look, never an empty map as if the queue had no segments."""

from __future__ import annotations

import asyncio
from pathlib import Path

import anyio
from fastapi.templating import Jinja2Templates

from app.settings import PROJECT_ROOT
from app.ui.charts import FILTERS
from app.ui.reads import EngineReads, SegmentsShown
from engine.errors import NoLeader, QueueNotFound
from engine.runtime.api import QueueEngine, SegmentInfo

SEGMENT = SegmentInfo("00000001.seg", 1, 90, 4096, 80, 10)


class Peer:
    """Stands in for a node: a replica here (``local``) or not, and a leader that answers
    ``leader_answer``, raises it, or never answers (``None``)."""

    def __init__(self, *, local: bool, leader_answer: object = None) -> None:
        self.local = local
        self.leader_answer = leader_answer
        self.asked = 0

    def segments(self, name: str) -> list[SegmentInfo]:
        if not self.local:
            raise QueueNotFound(f"queue {name}: no replica here")
        return [SEGMENT]

    async def fresh_segments(self, name: str) -> list[SegmentInfo]:
        self.asked += 1
        if self.leader_answer is None:
            await asyncio.sleep(3600)
        if isinstance(self.leader_answer, Exception):
            raise self.leader_answer
        assert isinstance(self.leader_answer, list)
        return self.leader_answer

    def leader_of(self, name: str) -> str | None:
        return "n1"


def _shown(peer: Peer, reads: EngineReads | None = None) -> SegmentsShown:
    node: QueueEngine = peer  # type: ignore[assignment]
    return anyio.run((reads or EngineReads()).segments_shown, node, "q", "n3", 0.05)


def test_whose_segments_are_shown() -> None:
    assert _shown(Peer(local=True)) == SegmentsShown([SEGMENT], "local", "n3")
    leaders = [SegmentInfo("00000007.seg", 500, 900, 8192, 1, 400)]
    assert _shown(Peer(local=False, leader_answer=leaders)) == SegmentsShown(
        leaders, "leader", "n1"
    )
    refused = _shown(Peer(local=False, leader_answer=NoLeader("queue q: no leader yet")))
    assert refused == SegmentsShown([], "absent", "n1", "queue q: no leader yet")
    silent = _shown(Peer(local=False))
    assert (silent.source, silent.segments) == ("absent", [])
    assert "did not answer within 50 ms" in silent.detail


def test_a_leaders_answer_is_kept_and_forgotten_like_the_nodes_own() -> None:
    reads = EngineReads()
    peer = Peer(local=False, leader_answer=[SEGMENT])
    _shown(peer, reads)
    _shown(peer, reads)
    assert peer.asked == 1
    reads.forget("q")
    _shown(peer, reads)
    assert peer.asked == 2
    # An answer that did not come is not kept: the next look asks again.
    peer.leader_answer = NoLeader("gone")
    reads.forget_except(set())
    _shown(peer, reads)
    _shown(peer, reads)
    assert peer.asked == 4


def _render(shown: SegmentsShown) -> str:
    env = Jinja2Templates(directory=Path(PROJECT_ROOT) / "templates").env
    env.filters.update(FILTERS)
    history = {"source": "local", "node": "n3", "detail": ""}
    return env.get_template("_queue_storage.html").render(
        segments=shown.segments,
        segments_shown=shown,
        widest=1,
        snapshots=[],
        compactions=[],
        history_chart="",
        history=history,
        log={"live_entries": 0, "dead_entries": 0},
        dead_per_100_live_max=50,
    )


def test_the_page_says_whose_map_it_is() -> None:
    own = _render(SegmentsShown([], "local", "n3"))
    assert 'id="segments-source"' not in own and "No segment files" in own
    leaders = _render(SegmentsShown([SEGMENT], "leader", "n1"))
    assert "The segments of n1's replica (the queue's leader)" in leaders
    assert 'data-segments="1"' in leaders
    absent = _render(SegmentsShown([], "absent", "n1", "queue q: no leader yet"))
    assert "The segment map is not available" in absent and "(n1)" in absent
    assert "queue q: no leader yet" in absent and "No segment files" not in absent
