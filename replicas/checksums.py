"""`replicas hash --check`: read b3sum check files and check each file they name, cold.

The check file's language is in `b3sum` (pure); here the files are read and hashed. A file that
cannot be read is FAILED with the reason in b3sum's own words, and checking goes on: failures
are counted and reported together, like `b3sum --check`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Iterator

from core.errors import MissingError, UsageError

from .b3sum import os_error_reason, parse_check_file
from core.coldio import open_cold
from .hashing import hash_whole


@dataclass(frozen=True)
class CheckResult:
    name: str           # as the check file names it (relative to the working directory)
    ok: bool
    reason: str = ""    # why it could not be read ('' for a plain mismatch)


def read_check_files(files: list[str]) -> list[tuple[str, str]]:
    """[(hex, name)] from every check file ('-' is standard input), all read before any hashing,
    so a malformed file is refused before anything is checked."""
    entries = []
    for f in files:
        if f == "-":
            entries += parse_check_file(sys.stdin.read(), "<stdin>")
            continue
        if not os.path.exists(f):
            raise MissingError(f"{f}: no such check file; make it with `replicas hash FILE... > {f}`")
        if os.path.isdir(f):
            raise UsageError(f"{f}: is a directory, not a check file")
        with open(f, "rb") as fh:
            raw = fh.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{f}: not UTF-8 text, so not a b3sum check file") from None
        entries += parse_check_file(text, f)
    return entries


def check_one(name: str, want: str) -> CheckResult:
    try:
        if os.path.isdir(name):
            raise IsADirectoryError(21, os.strerror(21), name)
        reader = open_cold(name)
    except OSError as e:
        return CheckResult(name, False, os_error_reason(e.strerror or str(e), e.errno or 0))
    try:
        return CheckResult(name, hash_whole(name, reader=reader) == want)
    except MissingError as e:
        return CheckResult(name, False, str(e).removeprefix(f"{name}: "))
    finally:
        reader.close()


def check_files(files: list[str]) -> Iterator[CheckResult]:
    """One result per line of the check files, in order, as each file is hashed."""
    for want, name in read_check_files(files):
        yield check_one(name, want)
