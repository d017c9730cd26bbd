"""Rebuilding a damaged or lost page of the ready index from the log.

Rule of this module: pure; a page is rebuilt only when the result is provably the page
that was stored: as many refs as its ``SpilledPage`` counts, and the same CRC32C of their
stored form (``encode_page``). Anything else is ``PageDamaged``, never a guess.

Why the log is enough for the pages that matter. A spilled page of a *main* lane holds a
run of that lane's pushes, whole (only full pages between head and tail are spilled, and
nothing leaves a lane but at its head), and a main lane is pushed in log order: a
message of level L with no delay goes to the tail of main lane L when its enqueue entry
applies. So the page's refs are, in log order, the messages of level L without delay of
the entries its index set names, from its first ref to its last; those entries are still
in the log because the messages are live. What breaks that is refused by the checks:
a delayed message released into the page (pushed out of log order), a duplicate among
those entries (never pushed), a returns lane (pushed in the order messages came back).
"""

from __future__ import annotations

from collections.abc import Iterable

import crc32c
import numpy as np
import numpy.typing as npt

from engine.errors import InvalidRequest, PageDamaged
from engine.queue import commands as cmd
from engine.queue.enqueue_codec import enqueue_records
from engine.queue.pages import SpilledPage, encode_page
from engine.queue.refs import FallbackTable, try_pack

U64 = npt.NDArray[np.uint64]


def rebuild_refs(
    page: SpilledPage,
    level: int,
    top: int,
    entries: Iterable[tuple[int, bytes]],
    table: FallbackTable,
) -> U64:
    """The refs of ``page``, a page of the main lane of ``level`` in a queue whose highest
    level is ``top``, from ``entries``: ``(index, command)`` of the log entries its index
    set names, ascending. ``PageDamaged`` if they do not give the page stored."""
    first, last = table.unpack(page.first), table.unpack(page.last)
    lo, hi = (first.index, first.slot), (last.index, last.slot)
    out: list[int] = []
    for index, command in entries:
        try:
            if cmd.command_kind(command) is not cmd.Kind.ENQUEUE:
                continue
            records = enqueue_records(command)
        except InvalidRequest:
            continue
        n = len(records)
        for slot in range(n):
            if not lo <= (index, slot) <= hi:
                continue
            record = records[slot]
            if min(int(record["priority"]), top) != level or int(record["delay_ms"]) > 0:
                continue
            size = int(record["body_len"]) + int(record["headers_len"])
            ref = try_pack(index, slot, size, n)
            if ref is None:
                ref = table.find(index, slot)
            if ref is not None:  # else the message left the queue: not in the page
                out.append(ref)
    refs = np.array(out, dtype=np.uint64)
    if len(refs) != page.count or crc32c.crc32c(encode_page(refs)) != page.crc:
        raise PageDamaged(
            f"page {page.handle} cannot be rebuilt from the log "
            f"({len(refs)} candidate messages for {page.count})",
            handle=page.handle,
        )
    return refs


__all__ = ["rebuild_refs"]
