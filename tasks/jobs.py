"""The reference app's Celery app, alone in a leaf module: every task module imports it
from here, and ``tasks/__init__.py`` (``celery -A tasks``) imports the task modules."""

from jobs_platform import create_app

app = create_app("tasks")
