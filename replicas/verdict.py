"""What verify last found about each member, and how far an interrupted full verify got (pure).

A `Verdict` is remembered in rig/verdicts.json so `replicas status` can say "mismatch (3 bad
pieces, found ...)" until `repair` or a clean verify replaces it; it holds the digest of the
manifest it was judged against, so a verdict about another manifest is not shown as this one's.
A `ScrubMark` is kept in rig/scrub.json while a `verify --full` is unfinished: the pieces done
from the start of the member and the bad ones among them, keyed on the manifest and the file's
identity, so `--resume` continues only on the very same file.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import EXIT_MISMATCH, EXIT_MISSING, EXIT_OK, RigError
from core.units import plural

from .constants import SCRUB_SCHEMA, VERDICTS_SCHEMA
from .manifest import Manifest, PieceRange

VERIFIED, MISMATCH, MISSING, UNREADABLE = "verified", "mismatch", "missing", "unreadable"
BROKEN = "broken"      # byte-identical, but does not parse as its format (replicas.checks.BROKEN)
VERDICT_STATES = (VERIFIED, MISMATCH, BROKEN, MISSING, UNREADABLE)
VERDICTS_KIND, SCRUB_KIND = "verdicts", "scrub"
VERDICTS_REMEDY = "delete it; the next `replicas verify` records the verdicts again"
SCRUB_REMEDY = "delete it; `replicas verify --full` then starts from the first piece"


@dataclass(frozen=True)
class Verdict:
    state: str                          # verified / mismatch / broken / missing / unreadable
    at: float                           # unix seconds when verify found it
    manifest: str                       # Manifest.digest() it was judged against
    how: str = ""                       # stamp / full / sample / repair / sync
    bad: tuple[PieceRange, ...] = ()    # the bad pieces of a mismatch
    detail: str = ""


@dataclass(frozen=True)
class ScrubMark:
    manifest: str                       # Manifest.digest() being verified against
    identity: tuple[int, int, int, int]  # (size, mtime_ns, inode, device) when the pieces were read
    done: int                           # pieces 0..done-1 are checked
    bad: tuple[int, ...] = ()           # bad piece indices among them


# Worst first: a member (or a model's roll-up) takes the worst state any of its files has.
CHECK_ORDER = ("mismatch", "broken", "missing", "unreadable", "identical")
# 'gone': a RAM member's file that is not there (tmpfs is emptied at reboot): expected, no alarm.
GONE = "gone"


def exit_code_of(states) -> int:
    """README's exit code for what was found of members or files, the one mapping `verify` and
    `status` share: 1 if any mismatches or does not parse, else 3 if any is missing or unreadable
    (a RAM member `gone` after a reboot is not: `replicas sync` restores it), else 0."""
    states = set(states)
    if states & {MISMATCH, BROKEN}:
        return EXIT_MISMATCH
    if states & {MISSING, UNREADABLE}:
        return EXIT_MISSING
    return EXIT_OK
STATUS_ORDER = (MISMATCH, BROKEN, MISSING, UNREADABLE, GONE, "stale", "unverified", VERIFIED)


def rollup_state(states, order=CHECK_ORDER) -> str:
    """The worst of the files' states (verify's states by default; status's with STATUS_ORDER):
    identical / verified only when every file is."""
    states = list(states)
    for s in order:
        if s in states:
            return s
    raise ValueError(f"no known state among {states!r}")


def rollup_verdict(verdicts: list[Verdict | None]) -> Verdict | None:
    """One verdict for a member from its files' verdicts: the worst state found, when it was
    found last, and every bad piece of the files in that state. None when no file has one.
    For a one-file model it is that file's verdict."""
    known = [v for v in verdicts if v is not None]
    if not known:
        return None
    if len(known) == 1 and len(verdicts) == 1:
        return known[0]
    state = rollup_state([v.state for v in known], (MISMATCH, BROKEN, MISSING, UNREADABLE, VERIFIED))
    worst = [v for v in known if v.state == state]
    newest = max(worst, key=lambda v: v.at)
    detail = newest.detail if len(worst) == 1 else plural(len(worst), "file") + f" {state}"
    return Verdict(state, newest.at, newest.manifest, newest.how, tuple(b for v in worst for b in v.bad), detail)


def verdict_of_check(state: str, at: float, manifest: Manifest, how: str, bad=(), detail: str = "") -> Verdict | None:
    """The verdict a member check leaves (verify's states: identical/mismatch/missing/unreadable);
    None when it proves nothing: a clean sample has not read the pieces it skipped."""
    if state == "identical":
        return None if how == "sample" else Verdict(VERIFIED, at, manifest.digest(), how)
    if state not in VERDICT_STATES:
        raise ValueError(f"unknown check state {state!r}")
    return Verdict(state, at, manifest.digest(), how, tuple(bad), detail)


def standing_mismatch(verdict: Verdict | None, manifest: Manifest | None) -> bool:
    """True while a mismatch found against this manifest has not been cleared."""
    return (verdict is not None and manifest is not None and verdict.state == MISMATCH
            and verdict.manifest == manifest.digest())


def standing_broken(verdict: Verdict | None, manifest: Manifest | None) -> bool:
    """True while a file found not to parse, against this manifest, has not been read clean since."""
    return (verdict is not None and manifest is not None and verdict.state == BROKEN
            and verdict.manifest == manifest.digest())


def mismatch_text(verdict: Verdict, when: str) -> str:
    """'mismatch (1 bad piece, found 2026-11-30 15:02)'; `when` is the formatted time."""
    what = plural(len(verdict.bad), "bad piece") if verdict.bad else verdict.detail or "content differs"
    return f"mismatch ({what}, found {when})"


def verdict_to_dict(v: Verdict) -> dict:
    return {"state": v.state, "at": v.at, "manifest": v.manifest, "how": v.how, "detail": v.detail,
            "bad": [{"index": b.index, "offset": b.offset, "length": b.length} for b in v.bad]}


def verdicts_to_doc(verdicts: dict[str, Verdict]) -> dict:
    return {"schema": VERDICTS_SCHEMA, "kind": VERDICTS_KIND,
            "members": {path: verdict_to_dict(v) for path, v in sorted(verdicts.items())}}


def _bad(where: str, key: str, what: str, remedy: str) -> RigError:
    return RigError(f"{where}: key '{key}' {what}; {remedy}")


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def verdicts_from_doc(doc: dict, where: str) -> dict[str, Verdict]:
    """Parse a verdicts document (kind and schema already checked by read_json)."""
    members = doc.get("members")
    if not isinstance(members, dict):
        raise _bad(where, "members", "is missing or not an object", VERDICTS_REMEDY)
    out = {}
    for path, d in members.items():
        key = f"members.{path}"
        if not isinstance(d, dict) or d.get("state") not in VERDICT_STATES:
            raise _bad(where, key + ".state", f"must be one of {', '.join(VERDICT_STATES)}", VERDICTS_REMEDY)
        if not isinstance(d.get("at"), (int, float)) or isinstance(d.get("at"), bool) or not isinstance(d.get("manifest"), str):
            raise _bad(where, key, "needs a number 'at' and a string 'manifest'", VERDICTS_REMEDY)
        bad = d.get("bad", [])
        if not isinstance(bad, list) or not all(isinstance(b, dict) and all(_int(b.get(k)) for k in ("index", "offset", "length"))
                                                for b in bad):
            raise _bad(where, key + ".bad", "must be a list of {index, offset, length} integers", VERDICTS_REMEDY)
        out[path] = Verdict(d["state"], float(d["at"]), d["manifest"], str(d.get("how", "")),
                            tuple(PieceRange(b["index"], b["offset"], b["length"]) for b in bad), str(d.get("detail", "")))
    return out


def scrub_to_doc(marks: dict[str, ScrubMark]) -> dict:
    return {"schema": SCRUB_SCHEMA, "kind": SCRUB_KIND,
            "members": {path: {"manifest": m.manifest, "identity": list(m.identity), "done": m.done, "bad": list(m.bad)}
                        for path, m in sorted(marks.items())}}


def scrub_from_doc(doc: dict, where: str) -> dict[str, ScrubMark]:
    members = doc.get("members")
    if not isinstance(members, dict):
        raise _bad(where, "members", "is missing or not an object", SCRUB_REMEDY)
    out = {}
    for path, d in members.items():
        ok = (isinstance(d, dict) and isinstance(d.get("manifest"), str) and _int(d.get("done")) and d["done"] >= 0
              and isinstance(d.get("identity"), list) and len(d["identity"]) == 4 and all(_int(x) for x in d["identity"])
              and isinstance(d.get("bad", []), list) and all(_int(x) for x in d.get("bad", [])))
        if not ok:
            raise _bad(where, f"members.{path}", "needs manifest, identity (4 integers), done and bad (piece indices)",
                       SCRUB_REMEDY)
        out[path] = ScrubMark(d["manifest"], tuple(d["identity"]), d["done"], tuple(d.get("bad", [])))
    return out


def resume_point(mark: ScrubMark | None, manifest: Manifest, identity: tuple[int, int, int, int]) -> tuple[int, tuple[int, ...]]:
    """(first piece to read, bad pieces already found) for a resumed full verify: where the mark
    says, when it is about this manifest and this very file; from the start otherwise."""
    if mark is None or mark.manifest != manifest.digest() or tuple(mark.identity) != tuple(identity):
        return 0, ()
    return min(mark.done, manifest.count), tuple(i for i in mark.bad if i < manifest.count)

