"""users and tokens mirrored from the cluster metadata

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-27 18:40:00.000000

On a cluster node, users and API tokens are the cluster metadata's: each node mirrors
them into its SQLite. ``replicated`` tells a mirrored row (the metadata holds it: its
deletion there deletes the row here) from a row made on this node alone (the bootstrap
admin, ``quorra user add`` before the first start), which the node proposes to the
metadata once its metadata replica is caught up. A single-node server never sets it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('users') as batch:
        batch.add_column(
            sa.Column('replicated', sa.Boolean(), nullable=False, server_default=sa.text('0'))
        )
    with op.batch_alter_table('api_tokens') as batch:
        batch.add_column(
            sa.Column('replicated', sa.Boolean(), nullable=False, server_default=sa.text('0'))
        )


def downgrade() -> None:
    with op.batch_alter_table('api_tokens') as batch:
        batch.drop_column('replicated')
    with op.batch_alter_table('users') as batch:
        batch.drop_column('replicated')
