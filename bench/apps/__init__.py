"""Celery apps the benchmark workers import (one module per variant).

Every module builds its app with ``make_app(broker_url)`` so the orchestrator can publish
through an identical app; the module-level ``app`` (what ``celery -A`` loads) reads the
broker from ``BENCH_BROKER_URL``. Without it the apps point at a closed port on purpose, so
a stray worker never touches the shared Redis.
"""
