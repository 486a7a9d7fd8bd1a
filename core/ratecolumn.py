"""A progress bar's rate column for the console scripts' bars, in its own module: Rich's progress
machinery loads only where bars are drawn, not in every command's start-up (docs/replicas.md
"Hashing at the drives' pace")."""

from __future__ import annotations

from rich.progress import ProgressColumn
from rich.text import Text

from .units import format_rate


# A progress rate is shown once its reports span this long: bytes arrive in blocks (16 MiB
# at 40 MB/s is one every 0.4 s), so a rate over a shorter span is off by a block or more.
RATE_AFTER_S = 3.0


class AverageRateColumn(ProgressColumn):
    """A progress bar's rate: the bytes the task has moved since its first report over the time
    since (until now, not until the last report), in decimal units (core.units.format_rate), shown
    once RATE_AFTER_S have passed. Rich's own speed column divides the steps of recent reports by the
    time between the first and the last of them: a copy reports durable bytes in coarse batches
    (after each fdatasync), and two batches landing close together read as GB/s under
    --max-rate 100M; a report that steps back (a file started over) and forward counted twice."""

    def __init__(self):
        super().__init__()
        self._first: dict[int, tuple[float, float]] = {}

    def render(self, task) -> Text:
        now = task.get_time()
        if task.finished and task.finished_time is not None and task.start_time is not None:
            now = task.start_time + task.finished_time        # a finished bar keeps its rate
        first_time, first_done = self._first.setdefault(task.id, (now, task.completed))
        if task.completed < first_done:                 # the task started over: so does its average
            self._first[task.id] = first_time, first_done = now, task.completed
        seconds = now - first_time
        if seconds < RATE_AFTER_S or task.completed <= first_done:
            return Text("", style="progress.data.speed")
        return Text(format_rate((task.completed - first_done) / seconds), style="progress.data.speed")
