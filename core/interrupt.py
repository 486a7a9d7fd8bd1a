"""Ctrl-C: one line and exit 130 before any command has started, however early it lands; and the
one policy of the long commands once they run, first Ctrl-C cancels, second aborts
(`cancel_on_interrupt`).

Python turns SIGINT into KeyboardInterrupt wherever the main thread is; while a console script
is still importing its modules or parsing its command line, that became a traceback or Typer's
silent exit 130. Nothing has been done yet then, so the guard writes the one line and exits at
once; `core.cli.ErrorBoundaryGroup.invoke` hands Ctrl-C back (KeyboardInterrupt, caught there
and by the commands that keep durable work) as soon as a command runs.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from .errors import EXIT_INTERRUPTED

# What an interrupted command says when it has no words of its own (exit 130). It promises no
# resume: iobench, run, replay, fio and whatif --add keep nothing half-done and start over; the
# commands that do resume (sync, verify --full, repair) say so in their own Interrupted message.
INTERRUPTED = "interrupted; nothing half-done was kept: run the same command again to start over"


def guard(prog: str) -> None:
    """Until a command runs, Ctrl-C exits at once with the one line. Left alone where Ctrl-C is
    ignored (a background job) or handled by someone else, and off the main thread."""
    def before_command(signum, frame):
        sys.stderr.write(f"{prog}: error: {INTERRUPTED}\n")
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)

    before_command.before_command = True
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, before_command)
    except ValueError:       # not the main thread
        pass


def guarded() -> bool:
    return bool(getattr(signal.getsignal(signal.SIGINT), "before_command", False))


def guard_if_started(module: str, prog: str) -> None:
    """From a package's __init__: guard when this package's CLI is the program starting (its
    console script PROG, or `python -m MODULE`), so the time its imports take is covered too. An
    import as a library (tests, another program) is left alone."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    as_module = "-m" in argv and argv.index("-m") + 1 < len(argv) and argv[argv.index("-m") + 1] == module
    if as_module or os.path.basename(sys.argv[0] if sys.argv else "") == prog:
        guard(prog)


@contextmanager
def cancel_on_interrupt(say: Callable[[str], None], what: str) -> Iterator[threading.Event]:
    """The one Ctrl-C policy of a long command: the first Ctrl-C sets the event it yields (the work
    stops at its next safe point, keeping what it made durable or measured) and `say`s `what`
    (what stopping means, e.g. 'stopping after this arm (again to abort)'); a second one aborts at
    once (KeyboardInterrupt, which the CLI boundary turns into the one line and exit 130). The
    handler before it is back when the block ends. Off the main thread, which takes no signals,
    the event is yielded and Ctrl-C never sets it."""
    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_int(signum, frame):
        if cancel.is_set():
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        cancel.set()
        say(what)

    signal.signal(signal.SIGINT, on_int)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)
