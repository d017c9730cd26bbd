"""The periodic trim that gives free heap back to the system (app/memory_trim.py)."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from app import memory_trim


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's malloc_trim")
def test_malloc_trim_is_glibcs() -> None:
    trim = memory_trim.malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was released, 0: there was none to release


def test_trim_forever_trims_on_a_worker_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[int] = []
    monkeypatch.setattr(
        memory_trim, "malloc_trim", lambda: lambda: threads.append(threading.get_ident())
    )

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(memory_trim.trim_forever(0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        count = len(threads)
        await asyncio.sleep(0.05)
        assert len(threads) == count >= 3  # trimmed, and no more once cancelled
        assert threading.get_ident() not in threads  # never on the event loop

    asyncio.run(main())
