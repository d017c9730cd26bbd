"""Users, permissions and API tokens in the metadata: the facts each node's SQLite held
alone before, so that a token made on one node works on every node.

Rule of this module: secrets never enter the log. A user carries its argon2 password
hash; a token its SHA-256 digest, shown prefix and name (the proposer draws the token
and its id, so the log holds values, never randomness). Users are keyed by name, tokens
by id; one digest belongs to one token. Puts are upserts; a repeated put answers
``Ok(False)``. Deleting a user deletes its tokens. Permission patterns are stored as
given: the app checks that they compile before it proposes them (compiling here could
differ between Python versions, and the machine must not).
"""

from __future__ import annotations

import dataclasses
import string
from typing import TYPE_CHECKING

from engine.cluster import meta_commands as mc
from engine.cluster.records import ROLES, Role, TokenRecord, UserRecord
from engine.cluster.replies import Ok
from engine.errors import Conflict, NotFound, ValidationFailed
from engine.raft.state_machine import ApplyMeta

if TYPE_CHECKING:
    from engine.cluster.meta_machine import MetaMachine, Touched

DIGEST_CHARS = 64
_HEX = frozenset(string.hexdigits.lower())


def on_put_user(m: MetaMachine, meta: ApplyMeta, cmd: mc.PutUser, touched: Touched) -> object:
    if not cmd.name or not cmd.password_hash:
        raise ValidationFailed("a user has a name and a password hash")
    if cmd.role not in ROLES:
        raise ValidationFailed(f"a role is one of {', '.join(ROLES)}")
    role: Role = cmd.role
    known = m.users.get(cmd.name)
    if known is None:
        if len(m.users) >= m.limits.cluster_users_max:
            raise ValidationFailed(f"the cluster holds at most {m.limits.cluster_users_max} users")
        user = UserRecord(cmd.name, cmd.password_hash, role, "", "", "", meta.now_ms, meta.index)
    elif (known.password_hash, known.role) == (cmd.password_hash, role):
        return Ok(False)
    else:
        user = dataclasses.replace(
            known, password_hash=cmd.password_hash, role=role, updated_index=meta.index
        )
    m.users[cmd.name] = user
    touched.users.add(cmd.name)
    return Ok(True)


def on_set_permissions(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.SetPermissions, touched: Touched
) -> object:
    known = _user(m, cmd.user)
    if (known.configure, known.write, known.read) == (cmd.configure, cmd.write, cmd.read):
        return Ok(False)
    m.users[cmd.user] = dataclasses.replace(
        known, configure=cmd.configure, write=cmd.write, read=cmd.read, updated_index=meta.index
    )
    touched.users.add(cmd.user)
    return Ok(True)


def on_delete_user(m: MetaMachine, meta: ApplyMeta, cmd: mc.DeleteUser, touched: Touched) -> object:
    _user(m, cmd.name)
    for token_id in sorted(t.id for t in m.tokens.values() if t.user == cmd.name):
        _drop_token(m, token_id, touched)
    del m.users[cmd.name]
    touched.users.add(cmd.name)
    return Ok(True)


def on_put_token(m: MetaMachine, meta: ApplyMeta, cmd: mc.PutToken, touched: Touched) -> object:
    if not cmd.id:
        raise ValidationFailed("a token has an id")
    if len(cmd.digest) != DIGEST_CHARS or not set(cmd.digest) <= _HEX:
        raise ValidationFailed("a token digest is 64 lowercase hex characters (SHA-256)")
    _user(m, cmd.user)
    known = m.tokens.get(cmd.id)
    if known is not None:
        if (known.user, known.digest, known.prefix, known.name) != (
            cmd.user,
            cmd.digest,
            cmd.prefix,
            cmd.name,
        ):
            raise Conflict(f"token {cmd.id} exists otherwise")
        return Ok(False)
    if cmd.digest in m.digests:
        raise Conflict("another token has that digest")
    if len(m.tokens) >= m.limits.cluster_tokens_max:
        raise ValidationFailed(f"the cluster holds at most {m.limits.cluster_tokens_max} tokens")
    m.tokens[cmd.id] = TokenRecord(cmd.id, cmd.user, cmd.digest, cmd.prefix, cmd.name, meta.now_ms)
    m.digests[cmd.digest] = cmd.id
    touched.tokens.add(cmd.id)
    return Ok(True)


def on_delete_token(
    m: MetaMachine, meta: ApplyMeta, cmd: mc.DeleteToken, touched: Touched
) -> object:
    if cmd.id not in m.tokens:
        raise NotFound(f"no token {cmd.id}")
    _drop_token(m, cmd.id, touched)
    return Ok(True)


def _user(m: MetaMachine, name: str) -> UserRecord:
    known = m.users.get(name)
    if known is None:
        raise NotFound(f"no user {name}")
    return known


def _drop_token(m: MetaMachine, token_id: str, touched: Touched) -> None:
    token = m.tokens.pop(token_id)
    del m.digests[token.digest]
    touched.tokens.add(token_id)


__all__ = [
    "DIGEST_CHARS",
    "on_delete_token",
    "on_delete_user",
    "on_put_token",
    "on_put_user",
    "on_set_permissions",
]
