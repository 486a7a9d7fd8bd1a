"""The project's error hierarchy and its exit codes (the one place they are mapped).

Exit codes: 0 ok, 1 mismatch or failed check, 2 bad usage or input, 3 a member missing or
unreadable, 4 a write failed (disk full, file too large, permission), 130 interrupted.
"""

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_MISSING = 3
EXIT_WRITE = 4
EXIT_INTERRUPTED = 130


class ReplicaTunerError(Exception):
    """Base error: its message is one line saying what, where and how to fix."""

    exit_code = EXIT_USAGE


class UsageError(ReplicaTunerError):
    """Bad usage or input (a malformed file, an impossible option)."""

    exit_code = EXIT_USAGE


class RigError(UsageError):
    """rig.toml, manifest.json or another rig file is malformed."""


class MismatchError(ReplicaTunerError):
    """Content differs from what it must be, or a check failed."""

    exit_code = EXIT_MISMATCH


class MissingError(ReplicaTunerError):
    """A member (file, drive) is missing or unreadable."""

    exit_code = EXIT_MISSING


class WriteError(ReplicaTunerError):
    """Writing a destination failed; nothing verified was touched."""

    exit_code = EXIT_WRITE


class Interrupted(ReplicaTunerError):
    """The user cancelled; durable work is kept for the next run."""

    exit_code = EXIT_INTERRUPTED


def error_for(code: int, message: str) -> ReplicaTunerError:
    """The error that ends a command with README's exit `code` (a step's outcome carried on as the
    command's own: a sync's worst destination, say); a code of no class here is usage (2)."""
    for cls in (MismatchError, MissingError, WriteError, Interrupted):
        if cls.exit_code == code:
            return cls(message)
    return UsageError(message)
