"""initial metadata schema

Revision ID: 0001
Revises: -
Create Date: 2026-11-22 05:37:43.180889
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('actor', sa.String(length=100), nullable=False),
    sa.Column('action', sa.String(length=50), nullable=False),
    sa.Column('target', sa.String(length=250), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('source', sa.String(length=10), nullable=False),
    sa.Column('remote_addr', sa.String(length=64), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_log'))
    )
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_log_at'), ['at'], unique=False)

    op.create_table('nodes',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('api_url', sa.String(length=300), nullable=False),
    sa.Column('raft_address', sa.String(length=300), nullable=True),
    sa.Column('is_local', sa.Boolean(), nullable=False),
    sa.Column('first_seen_at', sa.DateTime(), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_nodes'))
    )
    op.create_table('queues',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('uid', sa.String(length=32), nullable=False),
    sa.Column('arguments', sa.JSON(), nullable=False),
    sa.Column('policies', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=10), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("status IN ('creating', 'ready', 'deleting')", name=op.f('ck_queues_status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_queues')),
    sa.UniqueConstraint('name', name=op.f('uq_queues_name')),
    sa.UniqueConstraint('uid', name=op.f('uq_queues_uid'))
    )
    op.create_table('users',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('password_hash', sa.String(length=200), nullable=False),
    sa.Column('role', sa.String(length=10), nullable=False),
    sa.Column('configure', sa.String(length=500), nullable=False),
    sa.Column('write', sa.String(length=500), nullable=False),
    sa.Column('read', sa.String(length=500), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.CheckConstraint("role IN ('admin', 'user')", name=op.f('ck_users_role')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('name', name=op.f('uq_users_name'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('last_used_at', sa.DateTime(), nullable=True),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_api_tokens_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('digest', name=op.f('uq_api_tokens_digest'))
    )
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_tokens_user_id'), ['user_id'], unique=False)

    op.create_table('compactions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('queue_uid', sa.String(length=32), nullable=False),
    sa.Column('phase', sa.String(length=20), nullable=False),
    sa.Column('trigger', sa.String(length=10), nullable=False),
    sa.Column('started_at', sa.DateTime(), nullable=False),
    sa.Column('duration_ms', sa.Float(), nullable=False),
    sa.Column('segments_before', sa.Integer(), nullable=False),
    sa.Column('segments_after', sa.Integer(), nullable=False),
    sa.Column('bytes_before', sa.BigInteger(), nullable=False),
    sa.Column('bytes_after', sa.BigInteger(), nullable=False),
    sa.Column('live_entries', sa.BigInteger(), nullable=False),
    sa.Column('dead_entries_before', sa.BigInteger(), nullable=False),
    sa.Column('dead_entries_after', sa.BigInteger(), nullable=False),
    sa.CheckConstraint("trigger IN ('manual', 'auto')", name=op.f('ck_compactions_trigger')),
    sa.ForeignKeyConstraint(['queue_uid'], ['queues.uid'], name=op.f('fk_compactions_queue_uid_queues'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_compactions'))
    )
    with op.batch_alter_table('compactions', schema=None) as batch_op:
        batch_op.create_index('ix_compactions_queue_uid_started_at', ['queue_uid', 'started_at'], unique=False)

    op.create_table('snapshots',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('queue_uid', sa.String(length=32), nullable=False),
    sa.Column('raft_index', sa.BigInteger(), nullable=False),
    sa.Column('term', sa.BigInteger(), nullable=False),
    sa.Column('taken_at', sa.DateTime(), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('live_entries', sa.BigInteger(), nullable=False),
    sa.Column('trigger', sa.String(length=10), nullable=False),
    sa.Column('duration_ms', sa.Float(), nullable=False),
    sa.CheckConstraint("trigger IN ('manual', 'auto')", name=op.f('ck_snapshots_trigger')),
    sa.ForeignKeyConstraint(['queue_uid'], ['queues.uid'], name=op.f('fk_snapshots_queue_uid_queues'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_snapshots'))
    )
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.create_index('ix_snapshots_queue_uid_taken_at', ['queue_uid', 'taken_at'], unique=False)

    op.create_table('ui_sessions',
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('csrf_token', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('expires_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_ui_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('digest', name=op.f('pk_ui_sessions'))
    )
    with op.batch_alter_table('ui_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ui_sessions_user_id'), ['user_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('ui_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ui_sessions_user_id'))

    op.drop_table('ui_sessions')
    with op.batch_alter_table('snapshots', schema=None) as batch_op:
        batch_op.drop_index('ix_snapshots_queue_uid_taken_at')

    op.drop_table('snapshots')
    with op.batch_alter_table('compactions', schema=None) as batch_op:
        batch_op.drop_index('ix_compactions_queue_uid_started_at')

    op.drop_table('compactions')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_tokens_user_id'))

    op.drop_table('api_tokens')
    op.drop_table('users')
    op.drop_table('queues')
    op.drop_table('nodes')
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_log_at'))

    op.drop_table('audit_log')
