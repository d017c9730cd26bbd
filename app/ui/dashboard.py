"""The dashboard's routes in one router, with the sampler that feeds its charts
(``app.ui.series``) as the router's lifespan: it starts once the app's own lifespan
has started the node, and stops before the node stops."""

from __future__ import annotations

from fastapi import APIRouter

from app.ui import actions, admin, pages
from app.ui.series import sampler_lifespan

router = APIRouter(include_in_schema=False, lifespan=sampler_lifespan)
router.include_router(pages.router)
router.include_router(actions.router)
router.include_router(admin.router)
