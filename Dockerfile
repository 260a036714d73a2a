# The image docker-compose.yml runs. It installs the project in the build context (here
# jobs-platform; in your repository, your own project, which depends on jobs-platform)
# and the app's sources (here the reference app `tasks`): see docs/deploy.md.
# .dockerignore keeps .venv, .git, secrets, caches and local data out of the context.

FROM python:3.11-slim AS build
# A virtualenv copied whole into the runtime stage: no build leftovers or pip cache ship.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip install -c constraints.txt ".[postgres,gevent]"

FROM python:3.11-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JOBS_APP=tasks \
    JOBS_APP_DATA=/data \
    JOBS_DATABASE_URL=sqlite:////data/jobs_platform.sqlite3
# A fixed non-root uid, so a bind-mounted host directory can be chowned to it (10001:10001).
# /data belongs to it before VOLUME: a new named volume copies that ownership.
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --create-home --home-dir /home/app app \
    && mkdir /data \
    && chown app:app /data
COPY --from=build /opt/venv /opt/venv
# The reference app is not part of the package: it runs from source, like an app that
# lives in its repository next to its Celery config. If the `pip install` above installs
# your app, delete this COPY; otherwise copy your app's packages here instead.
WORKDIR /app
COPY tasks ./tasks
ENV PYTHONPATH=/app
USER app
VOLUME ["/data"]
# Compose gives every service its own command; this default runs the fast queue's worker.
CMD ["sh", "-c", "exec celery -A \"$JOBS_APP\" worker-profile fast"]
