"""``celery -A APP metrics``: the Prometheus exporter, above everything it reads.

::

    sources.py    what is read, and where: each feature's own keys          (pure)
    collector.py  the scrape: the broker, the coordination Redis, the
                  dead-letter table, at a flat cost                         (Redis, SQLAlchemy)
    server.py     the HTTP server                                           (prometheus-client)

Features record their counts through :mod:`jobs_platform.metrics` (a leaf); only this
package reads them back, with the rest of the platform's state (docs/metrics.md).
"""
