"""Alembic environment for the platform's tables (configured in code: see db.alembic_config)."""

from __future__ import annotations

from alembic import context

from jobs_platform.db import Base, engine_for

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = engine_for(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
