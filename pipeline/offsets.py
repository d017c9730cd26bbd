"""The stream reader's offsets: ``{"seq": n, "runs": [[first, last], ...]}``.

Rule: an offset names the messages of its micro-batch by id, as sorted, disjoint,
inclusive runs of consecutive ids. Spark writes every offset to the checkpoint's offset
log (and hands it back as JSON on every call), so its size is paid once per micro-batch
on the driver: a batch of consecutive ids is one pair, where a list of every id was some
8 bytes of JSON per message (160 KB for 20,000). Offsets written before runs existed
carry ``"ids"`` (every id); they are still read, so a checkpoint from then restarts.
Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def id_runs(ids: Iterable[int]) -> list[list[int]]:
    """The distinct ``ids`` as sorted inclusive ``[first, last]`` runs of consecutive ids."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and runs[-1][1] + 1 == i:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


def id_array_runs(ids: np.ndarray[Any, Any]) -> list[list[int]]:
    """``id_runs`` of an integer array, at numpy's speed (one step per run, not per id)."""
    unique = np.unique(ids.astype(np.int64))
    if not len(unique):
        return []
    breaks = np.flatnonzero(np.diff(unique) != 1)
    firsts = np.concatenate(([unique[0]], unique[breaks + 1]))
    lasts = np.concatenate((unique[breaks], [unique[-1]]))
    return [[int(f), int(la)] for f, la in zip(firsts.tolist(), lasts.tolist(), strict=True)]


def offset_id_array(offset: Mapping[str, Any]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """``offset_ids`` as an int64 array (one numpy step per run)."""
    if "runs" in offset:
        parts = [np.arange(int(f), int(la) + 1, dtype=np.int64) for f, la in offset["runs"]]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return np.array(offset_ids(offset), np.int64)


def make_offset(seq: int, ids: Iterable[int]) -> dict[str, Any]:
    """The end offset of the micro-batch of ``ids`` that brings the count handed to Spark
    to ``seq``."""
    return {"seq": seq, "runs": id_runs(ids)}


def offset_ids(offset: Mapping[str, Any]) -> list[int]:
    """The ids of an offset's micro-batch, ascending (from its runs, or its id list)."""
    if "runs" in offset:
        return [i for first, last in offset["runs"] for i in range(int(first), int(last) + 1)]
    return sorted(int(i) for i in offset.get("ids", []))
