"""The node's secret and the keys derived from it.

Rule of this module: a node has one secret, ``secret.key`` in its data directory (64 hex
digits, mode 0600, written to a temporary file and renamed into place on first start).
Every key is derived from it with a label of its own (HMAC-SHA256), so that no key
serves two purposes: the app signs dashboard sessions with the secret under its own
salts (app/ui/sessions.py); the engine seals receipts with ``receipt_key``. The nodes
of a cluster must accept each other's receipts: there the app derives the receipt key
from the cluster secret they share, under the same label (app/engine_seam.py).

Imports nothing heavy: ``quorra user add`` reads the secret without the engine.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

SECRET_KEY_FILE = "secret.key"
SECRET_BYTES = 32
RECEIPT_KEY_LABEL = b"quorra/receipts/v1"


def load_node_secret(data_dir: Path) -> bytes:
    """Read the node's secret, creating it (mode 0600) on first start."""
    path = data_dir / SECRET_KEY_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_hex(SECRET_BYTES))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    key = path.read_text(encoding="ascii").strip()
    assert len(key) >= 32, f"{path} is too short to be a secret key"
    return key.encode("ascii")


def derive_key(secret: bytes, label: bytes) -> bytes:
    """A 32-byte key for the purpose ``label`` names."""
    return hmac.digest(secret, label, "sha256")


def receipt_key(data_dir: Path) -> bytes:
    """The key that seals this node's receipts (engine/queue/receipts.py)."""
    return derive_key(load_node_secret(data_dir), RECEIPT_KEY_LABEL)


__all__ = ["SECRET_KEY_FILE", "derive_key", "load_node_secret", "receipt_key"]
