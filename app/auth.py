"""Credentials and permissions, free of HTTP and of the database.

Passwords are hashed with argon2 (slow on purpose: they are guessable). API tokens are
256-bit random strings, so a single SHA-256 digest is enough and cheap enough to look
up on every request. Permissions follow RabbitMQ: three regular expressions per user,
``configure``, ``write`` and ``read``, each matched against the *whole* queue name; an
empty pattern permits nothing.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Literal

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from app.problems import Forbidden

Permission = Literal["configure", "write", "read"]
Role = Literal["admin", "user"]
PERMISSIONS: tuple[Permission, ...] = ("configure", "write", "read")

TOKEN_PREFIX = "qra_"
TOKEN_BYTES = 32
"""256 bits of randomness per token."""
TOKEN_SHOWN_CHARS = 8
PATTERN_CHARS_MAX = 500

ARGON2_TIME_COST = 2
ARGON2_MEMORY_KIB = 19 * 1024
ARGON2_LANES = 1
_hasher = PasswordHasher(
    time_cost=ARGON2_TIME_COST, memory_cost=ARGON2_MEMORY_KIB, parallelism=ARGON2_LANES
)
"""argon2id at OWASP's recommended minimum (19 MiB, 2 passes, 1 lane): ~25 ms of CPU on
one thread here, against ~190 ms on four for argon2-cffi's default (64 MiB, 3 passes,
4 lanes), for the same resistance to guessing by that recommendation. The cost is what a
flood of logins takes from the queues. A hash made with other parameters still verifies
(they are in the hash) and is redone at the next successful login (``needs_rehash``)."""


# --- passwords -------------------------------------------------------------------------


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str, password: str) -> bool:
    try:
        return _hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    """Whether ``password_hash`` was made with parameters other than today's."""
    try:
        return _hasher.check_needs_rehash(password_hash)
    except InvalidHashError:
        return True


@cache
def _dummy_hash() -> str:
    return hash_password("quorra-timing-equaliser")


def check_password(password_hash: str | None, password: str) -> bool:
    """``verify_password``, at the same cost when there is no such user (``None``), so
    that timing does not tell which user names exist."""
    if password_hash is None:
        verify_password(_dummy_hash(), password)
        return False
    return verify_password(password_hash, password)


def random_password() -> str:
    return secrets.token_urlsafe(18)


# --- tokens ----------------------------------------------------------------------------


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(TOKEN_BYTES)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def token_prefix(token: str) -> str:
    return token[: len(TOKEN_PREFIX) + TOKEN_SHOWN_CHARS]


def session_digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8")).hexdigest()


# --- permissions -----------------------------------------------------------------------


def pattern_error(pattern: str) -> str | None:
    """Why ``pattern`` is not a usable permission, or None when it is."""
    if len(pattern) > PATTERN_CHARS_MAX:
        return f"longer than {PATTERN_CHARS_MAX} characters"
    try:
        re.compile(pattern)
    except re.error as e:
        return f"not a regular expression: {e}"
    return None


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


MATCH_ALL = ".*"
"""The bootstrap admin's pattern, and most users': it matches every name without a
newline (``.`` does not match one), so it is answered without the cache."""


def permits(pattern: str, queue_name: str) -> bool:
    """RabbitMQ semantics: the pattern must match the whole name; ``""`` matches nothing.

    ``MATCH_ALL`` is answered directly: remembered per name, it kept an entry of about
    200 bytes for each queue a request named (up to the cache's 4,096), made amid the
    request's short-lived objects, on a node of thousands of idle queues."""
    if pattern == "":
        return False
    if pattern == MATCH_ALL:
        return "\n" not in queue_name
    return _permits(pattern, queue_name)


@lru_cache(maxsize=4096)
def _permits(pattern: str, queue_name: str) -> bool:
    """Remembered per pattern and name: every message request asks it of the same few
    pairs, and the match was a regular expression run each time."""
    return _compiled(pattern).fullmatch(queue_name) is not None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the user behind a token, a Basic login or a dashboard session."""

    user_id: int
    name: str
    role: Role
    configure: str
    write: str
    read: str
    token_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def pattern(self, permission: Permission) -> str:
        if permission == "configure":
            return self.configure
        if permission == "write":
            return self.write
        assert permission == "read"
        return self.read

    def can(self, permission: Permission, queue_name: str) -> bool:
        return permits(self.pattern(permission), queue_name)

    def can_see(self, queue_name: str) -> bool:
        """Any of configure, write or read on a queue lets a user see it: its name and
        figures, in ``GET /queues``, ``GET /cluster``'s ``leads``, ``/metrics`` and the
        dashboard. The one rule of visibility; nothing else decides it."""
        return any(permits(self.pattern(p), queue_name) for p in PERMISSIONS)


def require(principal: Principal, permission: Permission, queue_name: str) -> None:
    """Raise 403 unless ``principal`` may ``permission`` on ``queue_name``.

    The admin role does not bypass permissions (as in RabbitMQ): the bootstrap admin
    holds ``.*`` on all three.
    """
    if not principal.can(permission, queue_name):
        raise Forbidden(f"user {principal.name!r} has no {permission} permission on {queue_name!r}")


def require_flow(principal: Principal, source: str, target: str) -> None:
    """Raise 403 unless ``principal`` may make messages of ``source`` flow into ``target``
    (a dead-letter target, a move): ``read`` on the source and ``write`` on the target.

    RabbitMQ's rule for dead-letter exchanges. Without it, ``configure`` on one queue
    would let a user read another: point the first at a queue they read, and wait.
    """
    require(principal, "read", source)
    require(principal, "write", target)
