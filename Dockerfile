# The image docker-compose.yml runs: the library and the reference app.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY jobs_platform ./jobs_platform
COPY tasks ./tasks
RUN pip install --no-cache-dir .
USER nobody
