"""Request and response bodies of the admin API (users, tokens, audit), one model per
direction: what a client sends (``...In``/``...Patch``) never doubles as what it gets."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.auth import pattern_error
from app.state import EngineStatus

USER_NAME_PATTERN = r"^[A-Za-z0-9._@-]{1,100}$"
ROW_ID_MAX = (1 << 63) - 1
"""SQLite's largest row id (a signed 64-bit integer): an id parameter beyond it is 422,
never a value handed to SQLite (which would overflow)."""


def _valid_pattern(pattern: str) -> str:
    error = pattern_error(pattern)
    if error is not None:
        raise ValueError(error)
    return pattern


PermissionPattern = Annotated[
    str,
    Field(
        max_length=500,
        description="A regular expression over queue names, matched in full.",
        json_schema_extra={"format": "regex"},
    ),
    AfterValidator(_valid_pattern),
]
UserName = Annotated[str, Field(pattern=USER_NAME_PATTERN, description="1-100 characters.")]
Password = Annotated[str, Field(min_length=8, max_length=1024)]


class _In(BaseModel):
    """Strict, as the queue API's bodies (app/api/queue_schemas.py): no coercions."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Permissions(_In):
    """RabbitMQ-style: ``""`` permits nothing, ``".*"`` everything."""

    configure: PermissionPattern = ""
    write: PermissionPattern = ""
    read: PermissionPattern = ""


class UserIn(_In):
    name: UserName
    password: Password
    role: Literal["admin", "user"] = "user"
    permissions: Permissions = Field(default_factory=Permissions)


class UserPatch(_In):
    password: Password | None = None
    role: Literal["admin", "user"] | None = None
    permissions: Permissions | None = None


class UserOut(BaseModel):
    name: str
    role: Literal["admin", "user"]
    permissions: Permissions
    created_at: datetime
    updated_at: datetime


class TokenIn(_In):
    name: str = Field(default="", max_length=200, description="A label, to recognise the token.")
    user: UserName | None = Field(
        default=None, description="Admins only: create the token for this user."
    )


class TokenCreated(BaseModel):
    token: str = Field(description="The secret. Shown only in this response.")
    id: str
    user: str
    name: str
    created_at: datetime


class TokenOut(BaseModel):
    id: str
    user: str
    name: str
    prefix: str = Field(description="The token's first characters.")
    created_at: datetime
    last_used_at: datetime | None


class WhoAmI(BaseModel):
    name: str
    role: Literal["admin", "user"]
    permissions: Permissions
    token_id: str | None


class AuditOut(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, object]
    source: str
    remote_addr: str


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    ready: bool
    migrations: str | None = Field(description="The metadata schema revision, once migrated.")
    engine: EngineStatus
