"""The chart of the run (PNG, matplotlib's Agg backend: no display needed).

Top: jobs finished per second on each queue, from the task events (a 3-second moving
average). Bottom: each queue's depth (waiting + in flight) and the delayed store, from the
exporter's samples. Vertical lines mark what the tour did (flash sale, SIGKILL, ...).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: render to a file, never to a window

import matplotlib.pyplot as plt

from tasks.demo.observe import QUEUES
from tasks.demo.tour import Facts

COLOURS = {"fast": "tab:blue", "heavy": "tab:orange", "thirdparty": "tab:green"}
SMOOTH_S = 3


def throughput(facts: Facts) -> dict[str, tuple[list[float], list[float]]]:
    """Per queue: seconds since the start, jobs finished per second (moving average)."""
    end = max(1, math.ceil(facts.t_end - facts.t0))
    series = {}
    for queue in QUEUES:
        per_second: Counter[int] = Counter()
        for track in facts.tracks.values():
            finished = track.succeeded or track.failed
            if track.queue == queue and finished is not None:
                per_second[int(finished - facts.t0)] += 1
        xs = list(range(end + 1))
        raw = [per_second.get(x, 0) for x in xs]
        smooth = [
            sum(raw[max(0, i - SMOOTH_S + 1) : i + 1]) / min(SMOOTH_S, i + 1)
            for i in range(len(raw))
        ]
        series[queue] = ([float(x) for x in xs], smooth)
    return series


def draw(facts: Facts, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for queue, (xs, ys) in throughput(facts).items():
        top.plot(xs, ys, label=queue, color=COLOURS[queue])
    top.set_ylabel("jobs finished / s")
    top.set_title(f"make demo ({facts.workload.name} tour): throughput and queue depth")
    top.legend(loc="upper right")
    samples = [s for s in facts.samples if s.ok and s.t >= facts.t0 - 1]
    xs = [s.t - facts.t0 for s in samples]
    for queue in QUEUES:
        depth = [s.waiting.get(queue, 0) + s.inflight.get(queue, 0) for s in samples]
        bottom.plot(xs, depth, label=f"{queue} (waiting + in flight)", color=COLOURS[queue])
    bottom.set_ylabel("jobs in the queue")
    bottom.set_xlabel("seconds since the workload began")
    store = bottom.twinx()  # the reminders pile up for 24 h: their own scale
    store.plot(
        xs,
        [s.delayed for s in samples],
        label="delayed store (right)",
        color="grey",
        linestyle="--",
    )
    store.set_ylabel("jobs in the delayed store")
    store.set_ylim(bottom=0)
    lines = bottom.get_legend_handles_labels()
    extra = store.get_legend_handles_labels()
    bottom.legend(lines[0] + extra[0], lines[1] + extra[1], loc="upper center", fontsize=8)
    for axis in (top, bottom):
        axis.grid(alpha=0.3)
        axis.set_xlim(left=0)
    for n, (moment, label) in enumerate(sorted(facts.marks)):
        x = moment - facts.t0
        for axis in (top, bottom):
            axis.axvline(x, color="red", alpha=0.4, linestyle=":")
        top.annotate(
            label,
            (x, 0.98 - 0.3 * (n % 3)),  # staggered: marks seconds apart must not overlap
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="top",
            ha="right",
            fontsize=8,
            color="darkred",
        )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
