"""Where a phase's threads spent their time: on a core, or runnable and waiting for one.

Linux keeps per thread, in `/proc/self/task/TID/schedstat`, the ns it ran on a core and the ns it
sat runnable in a run queue (its core was taken by another thread or process). Summed per group —
the thread running the phase, the engine's dequantizing helpers, and the process's others (the
reader's lanes, its watchdog) — at a phase's start and end: the engine thread's wall time is its
time on a core, waiting for one, and asleep (for reads, for its helpers, for the interpreter's
lock, for a page). docs/engine.md "Keeping the engine storage-bound".
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass

ENGINE_HELPERS = "dequant"      # the engine's helper threads' name prefix (EmbeddedEngine's pool)
GROUPS = ("engine", "helpers", "others")


@dataclass
class Times:
    """Per group of GROUPS: ns on a core and ns runnable without one (the thread running the phase,
    its dequantizing helpers, every other thread of the process)."""

    cpu: dict[str, int]
    runq: dict[str, int]
    minor_faults: int = 0       # the process's page faults served from memory (a fresh page: zeroed) ...
    major_faults: int = 0       # ... and read in from a drive

    def __sub__(self, o: Times) -> Times:
        return Times({g: self.cpu[g] - o.cpu[g] for g in GROUPS}, {g: self.runq[g] - o.runq[g] for g in GROUPS},
                     self.minor_faults - o.minor_faults, self.major_faults - o.major_faults)


def _schedstat(tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
            run, wait = f.read().split()[:2]
        return int(run), int(wait)
    except (OSError, ValueError):
        return None         # not Linux, no schedstat, or the thread ended


def sample() -> Times | None:
    """The process's live threads' counts now, in GROUPS: the caller (the thread running the phase),
    the threads named ENGINE_HELPERS*, the others; and the process's page faults. None where the
    system keeps no such counts. A thread that ends within a phase takes its counts with it (the
    reader's and the engine's threads live as long as the run)."""
    me = threading.current_thread()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    t = Times(dict.fromkeys(GROUPS, 0), dict.fromkeys(GROUPS, 0), ru.ru_minflt, ru.ru_majflt)
    for th in threading.enumerate():
        tid = th.native_id
        got = _schedstat(tid) if tid is not None else None
        if got is None:
            if th is me:
                return None
            continue
        g = "engine" if th is me else "helpers" if th.name.startswith(ENGINE_HELPERS) else "others"
        t.cpu[g] += got[0]
        t.runq[g] += got[1]
    return t
