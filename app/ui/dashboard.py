"""The dashboard's routers, and the sampler that feeds its charts (``app.ui.series``):
the app's lifespan runs it once the node has started and stops it before the node stops."""

from __future__ import annotations

from app.ui import actions, admin, cluster_page, pages
from app.ui.series import sampler_lifespan

ROUTERS = (pages.router, actions.router, admin.router, cluster_page.router)

__all__ = ["ROUTERS", "sampler_lifespan"]
