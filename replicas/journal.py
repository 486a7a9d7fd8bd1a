"""The durable-piece journal of a `.partial` copy: which pieces reached the disk (after
fdatasync), so an interrupted copy (Ctrl-C, kill -9, power loss) resumes without recopying them.

JSON lines next to the partial file: a header naming the source identity and piece size, then
one record per durable piece, appended and fsynced. A torn last line is ignored. A record
{"piece": i, "bad": true} withdraws a piece that failed read-back verification.
"""

from __future__ import annotations

import json
import os

from .constants import JOURNAL_SCHEMA


def journal_header(source: str, identity, piece_size: int) -> dict:
    return {"schema": JOURNAL_SCHEMA, "source": os.path.abspath(source), "size": identity.size,
            "mtime_ns": identity.mtime_ns, "inode": identity.inode, "piece_size": piece_size}


def parse_journal(text: str) -> tuple[dict | None, dict[int, str]]:
    """(header, {piece: blake3}) from journal text (pure); (None, {}) if the header is unreadable."""
    lines = text.split("\n")
    try:
        header = json.loads(lines[0])
        if not isinstance(header, dict) or header.get("schema") != JOURNAL_SCHEMA:
            return None, {}
    except (ValueError, IndexError):
        return None, {}
    durable: dict[int, str] = {}
    for line in lines[1:]:
        try:
            rec = json.loads(line)
            i = int(rec["piece"])
        except (ValueError, KeyError, TypeError):
            continue  # a torn line from a crash; records after it were appended by a later run
        if rec.get("bad"):
            durable.pop(i, None)
        else:
            durable[i] = str(rec["blake3"])
    return header, durable


def read_journal(path: str) -> tuple[dict | None, dict[int, str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_journal(f.read())
    except FileNotFoundError:
        return None, {}


class Journal:
    """Append-only, fsynced after every record batch."""

    def __init__(self, path: str, header: dict, fresh: bool):
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC | (os.O_TRUNC if fresh else 0)
        self.fd = os.open(path, flags, 0o644)
        if fresh:
            self._write([header])
        else:
            # make sure a torn tail does not glue onto the next record
            if os.fstat(self.fd).st_size:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        os.write(self.fd, b"\n")

    def _write(self, records: list[dict]) -> None:
        os.write(self.fd, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records).encode())
        os.fsync(self.fd)

    def durable(self, pieces: list[tuple[int, str]]) -> None:
        if pieces:
            self._write([{"piece": i, "blake3": h} for i, h in pieces])

    def withdraw(self, pieces: list[int]) -> None:
        if pieces:
            self._write([{"piece": i, "bad": True} for i in pieces])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
