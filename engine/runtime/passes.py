"""Passes that never overlap: the shape of the reconcile loop and of the moves off
leaving nodes.

Rule: ``trigger`` asks for a pass, now or after the one running (asks during a pass
coalesce into one more); a pass that reports it changed something asks for another.
Nothing runs once the node stops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.runtime.context import NodeContext


class Passes:
    """Runs ``one_pass`` of a subclass as the module's rule says, on the node's loop."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.wanted = False
        self.running = False

    def trigger(self) -> None:
        """Ask for a pass: now, or after the one running."""
        ctx = self.ctx
        if not ctx.running or ctx.stopping:
            return
        self.wanted = True
        if not self.running:
            self.running = True
            ctx.spawn(self.run())

    async def run(self) -> None:
        try:
            while self.wanted and self.ctx.running:
                self.wanted = False
                if await self.one_pass():
                    self.wanted = True
        finally:
            self.running = False

    async def one_pass(self) -> bool:
        """One pass; whether it changed something (then another follows)."""
        raise NotImplementedError


__all__ = ["Passes"]
