"""Flow control across the fleet: how many jobs of one key run at once, and dispatches of
one key collapsed into one run.

::

    options.py      the declaration rules of the flow options (pure)
    concurrency.py  ``concurrency_key`` / ``concurrency_limit``: slots as leases, a wait list
    debounce.py     ``debounce`` / ``debounce_key``: one run with the last arguments

Both live on the coordination Redis (``JOBS_COORDINATION_URL``), so every worker and
every queue agree; ``docs/flow-control.md`` says what each costs.
"""
