"""What both sides of a stream (app/api/stream.py) share: the refusal of a frame and its
``error`` frame.

Rule: a frame refused before it changed anything raises ``FrameError``; the reader
answers it with ``error_frame`` (the RFC 9457 fields of the problem, and what it
answers: ``of``, and the ``seq`` or ``ref`` the client gave) and keeps the connection.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError

from app.auth import Principal
from app.problems import AppProblem, Forbidden
from engine.errors import QuorraError, ValidationFailed


class FrameError(Exception):
    """A frame refused before it changed anything: answered with an error frame."""

    def __init__(self, problem: QuorraError | AppProblem, **about: object) -> None:
        super().__init__(problem.detail)
        self.problem = problem
        self.about = about


def error_frame(problem: QuorraError | AppProblem, **about: object) -> dict[str, object]:
    """The ``error`` frame of a problem: its RFC 9457 fields, and what it answers."""
    frame: dict[str, object] = {
        "op": "error",
        "type": problem.problem_type,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
    }
    if problem.retry_after_s is not None:
        frame["retry_after_s"] = problem.retry_after_s
    frame.update(about)
    return frame


def refusal(e: Exception) -> QuorraError:
    """A refused frame's error: the schema's errors (app/api/message_bodies.py) in one
    ``ValidationFailed``, or the parser's own typed error."""
    if isinstance(e, QuorraError):
        return e
    assert isinstance(e, RequestValidationError)
    errors = "; ".join(
        f"{'.'.join(str(p) for p in err['loc'][1:])}: {err['msg']}" for err in e.errors()
    )
    return ValidationFailed(errors or "invalid frame")


_CONFIRM_HEAD = b"\x82\xa2op\xa7confirm\xa3seq"
"""``{"op": "confirm", "seq": ...}`` in MessagePack up to the value of ``seq``."""
_UINT_TAGS = ((1 << 8, b"\xcc", 1), (1 << 16, b"\xcd", 2), (1 << 32, b"\xce", 4))


def confirm_frame(seq: int) -> bytes:
    """The ``confirm`` frame of ``seq`` (0 to 2**64 - 1), byte for byte what
    ``msgpack.packb`` gives: it is sent once per publish, and ``packb`` makes (and frees)
    a packer and its buffer for every call."""
    if seq < 0x80:
        return _CONFIRM_HEAD + bytes((seq,))
    for bound, tag, size in _UINT_TAGS:
        if seq < bound:
            return _CONFIRM_HEAD + tag + seq.to_bytes(size, "big")
    return _CONFIRM_HEAD + b"\xcf" + seq.to_bytes(8, "big")


def ref_of(frame: dict[str, Any]) -> dict[str, object]:
    """The client's ``ref`` of a settle frame, echoed in its answer."""
    ref = frame.get("ref")
    return {"ref": ref} if type(ref) in (int, str) else {}


def forbidden(who: Principal, name: str, permission: str) -> Forbidden:
    return Forbidden(f"user {who.name!r} has no {permission} permission on {name!r}")


__all__ = ["FrameError", "confirm_frame", "error_frame", "forbidden", "ref_of", "refusal"]
