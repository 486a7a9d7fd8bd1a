"""The `replicas` console script.

`replicas hash FILE...` of plain files is b3sum's job and is answered at b3sum's pace: hashing a
few GB from RAM takes less time than the full command line's imports (Typer, Rich, the engines'
modules), so when nothing else is asked (no option, plain files, no progress bars to draw) this
imports only the hashing and prints the same lines, errors and exit codes. Anything else goes
to the full command line (`replicas.cli`), which answers every case (docs/replicas.md, "b3sum's
language").
"""

from __future__ import annotations

import os
import sys

from models.formats import SPLIT_NAME


def main() -> None:
    argv = sys.argv[1:]
    if _plain_hash(argv):
        sys.exit(_hash(argv[1:]))
    from .cli import main as full_cli

    full_cli()


def _plain_hash(argv: list[str]) -> bool:
    """`hash` of regular files only, no option, and progress that would not be drawn anyway
    (stderr is no terminal): the case `_hash` answers exactly as the full command does."""
    if len(argv) < 2 or argv[0] != "hash" or sys.stderr.isatty() or os.environ.get("REPLICAS_PROGRESS"):
        return False
    for a in argv[1:]:
        if a.startswith("-") or not os.path.isfile(a):
            return False          # an option, a directory, a missing file: the full command says what
        m = SPLIT_NAME.match(os.path.basename(a))
        if m and int(m["count"]) > 1:
            return False          # perhaps a split GGUF set: hashed as a model
    return True


def _hash(paths: list[str]) -> int:
    """What `replicas hash FILE...` does for plain files: b3sum's line for each, an error line
    for a file that cannot be read (the others are still hashed); the worst exit code."""
    from core.errors import ReplicaTunerError

    from .b3sum import format_line
    from .hashing import hash_whole

    codes = [0]
    try:
        for path in paths:
            try:
                digest = hash_whole(path)
            except ReplicaTunerError as e:
                sys.stderr.write(f"replicas: error: {e}\n")
                sys.stderr.flush()
                codes.append(e.exit_code)
                continue
            sys.stdout.write(format_line(digest, path) + "\n")
            sys.stdout.flush()
    except BrokenPipeError:      # `replicas hash ... | head -1`: as the full command, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return max(codes)
