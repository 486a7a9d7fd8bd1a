"""b3sum's language (pure): the `<hex>  <name>` lines it prints and the check files it reads.

b3sum escapes a name holding a backslash or a newline: the line starts with `\\` and the name
has `\\\\` and `\\n` in their place. A check line is 64 hex digits, two spaces, the name.
"""

from __future__ import annotations

import re

from core.errors import UsageError

_LINE = re.compile(r"^([0-9a-fA-F]{64})  (.+)$")


def _shown(name: str) -> str:
    """The name as b3sum shows it: escaped, and marked with a leading backslash, when it holds a
    backslash or a newline."""
    if "\\" in name or "\n" in name:
        return "\\" + name.replace("\\", "\\\\").replace("\n", "\\n")
    return name


def format_line(hexdigest: str, name: str) -> str:
    """The line b3sum prints for `name` (no newline); the escape mark goes before the hash."""
    shown = _shown(name)
    if shown is name:
        return f"{hexdigest}  {name}"
    return f"\\{hexdigest}  {shown[1:]}"


def _unescape(name: str, where: str) -> str:
    out, i = [], 0
    while i < len(name):
        c = name[i]
        if c == "\\":
            nxt = name[i + 1:i + 2]
            if nxt not in ("\\", "n"):
                raise UsageError(f"{where}: bad escape '\\{nxt}' in the file name; b3sum escapes only '\\\\' and '\\n'")
            out.append("\\" if nxt == "\\" else "\n")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_check_file(text: str, where: str) -> list[tuple[str, str]]:
    """[(hex, name)] from a b3sum check file; UsageError naming the line for anything else."""
    entries = []
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line:
            continue
        escaped = line.startswith("\\")
        m = _LINE.match(line[1:] if escaped else line)
        if m is None:
            raise UsageError(f"{where}:{n}: not a b3sum line (expected 64 hex digits, two spaces, a file name); "
                             "make it with `replicas hash FILE... > FILE` or `b3sum`")
        name = _unescape(m.group(2), f"{where}:{n}") if escaped else m.group(2)
        entries.append((m.group(1).lower(), name))
    if not entries:
        raise UsageError(f"{where}: holds no checksum lines; make it with `replicas hash FILE... > {where}`")
    return entries


def check_line(name: str, ok: bool, reason: str = "") -> str:
    """'NAME: OK', 'NAME: FAILED' or 'NAME: FAILED (reason)', as `b3sum --check` prints."""
    shown = _shown(name)
    return f"{shown}: OK" if ok else f"{shown}: FAILED" + (f" ({reason})" if reason else "")


def os_error_reason(strerror: str, errno: int) -> str:
    """How b3sum (Rust) words an OS error: 'No such file or directory (os error 2)'."""
    return f"{strerror} (os error {errno})"


def failures_warning(prog: str, failed: int) -> str:
    """The line b3sum ends a failing check with, on stderr."""
    return f"{prog}: WARNING: {failed} computed checksum{'' if failed == 1 else 's'} did NOT match"
