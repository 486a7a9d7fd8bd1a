"""Whether a colibri run's log proves that its profile was applied (pure): every mirror loaded
whole under the drive number the profile's weight order assumes, the weights were taken (not
rejected for a probe), and what each drive served (the MIRROR: statistics line).

colibri's lines are read by `engines.colibri.read_log`; `engine_bridge.profiles.launch` starts
the process and captures the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines import colibri

from .confirm import Check, exit_check
from .profile import Profile

CHECKS = ("exit", "mirrors", "weights", "served")


@dataclass(frozen=True)
class Expectation:
    mirrors: tuple[str, ...]     # mirror directories, in COLI_MODEL_MIRROR order
    weights: tuple[int, ...]     # one per drive, primary first (() for a single drive)
    stripe: bool = False         # the profile asked for striping (DIRECT=1, COLI_MIR_STRIPE=1)


def expectation_of(p: Profile) -> Expectation:
    env = p.env
    weights = (p.primary_weight,) + p.replica_weights if p.replicas else ()
    return Expectation(mirrors=p.replicas, weights=weights, stripe=colibri.ENV_STRIPE in env)


def _mirrors(log: colibri.LogReport, expect: Expectation) -> Check:
    observed = "; ".join(f"{m.path} {m.shards}/{m.total} shards replica {m.replica}" for m in log.loaded) or "none"
    if not expect.mirrors:
        if log.loaded:
            return Check("mirrors", False, "none", observed,
                         "colibri loaded mirrors the profile did not ask for (an inherited mirror variable?)")
        return Check("mirrors", True, "none", observed, "single drive: no mirror requested")
    problems = []
    for k, want in enumerate(expect.mirrors, 1):
        got = [m for m in log.loaded if m.path == want]
        if not got:
            why = [r for p, r in log.skipped if p == want]
            problems.append(f"mirror {want} did not load" + (f" ({why[-1]})" if why else " (no '[MIRROR] ...: N/M shards' line)"))
            continue
        m = got[-1]
        if m.shards < m.total:
            problems.append(f"mirror {want} loaded {m.shards}/{m.total} shards; colibri reads the others from the primary")
        if m.replica != k:
            problems.append(f"mirror {want} is drive {m.replica}, not {k}: an earlier mirror did not load, "
                            "so the weights no longer line up with the drives")
    problems += [f"colibri skipped {path} ({what} differs from the primary)" for path, what in log.files_skipped]
    expected = f"{len(expect.mirrors)} mirror(s), every shard"
    return Check("mirrors", not problems, expected, observed,
                 "; ".join(problems) if problems else f"every mirror loaded whole ({len(expect.mirrors)})")


def _weights(log: colibri.LogReport, expect: Expectation) -> Check:
    if not expect.weights:
        return Check("weights", True, "", "", "single drive: no weights")
    want = "/".join(colibri.split_percents(expect.weights))
    seen = "/".join(log.split) if log.split else "none"
    if log.weights_rejected is not None:
        return Check("weights", False, want, f"rejected {log.weights_rejected}",
                     f"colibri rejected {colibri.ENV_WEIGHTS}={log.weights_rejected} (it wanted {log.weights_wanted} "
                     "weights, one per drive that loaded) and probed the drives instead")
    if log.drives is None:
        return Check("weights", False, want, "none", "no '[MIRROR] N drives | read split' line: the split is unconfirmed")
    if log.drives != len(expect.weights):
        return Check("weights", False, want, seen,
                     f"colibri reads {log.drives} drive(s), the profile gives {len(expect.weights)} weights")
    if log.split_how != colibri.HOW_WEIGHTS:
        return Check("weights", False, want, seen, f"colibri split the reads by '{log.split_how}', not by {colibri.ENV_WEIGHTS}")
    ok = seen == want
    return Check("weights", ok, want, seen,
                 "colibri applied the weights (percent of experts per drive)" if ok
                 else "colibri's read split differs from the weights' cuts")


def _served(log: colibri.LogReport, expect: Expectation) -> Check:
    n = 1 + len(expect.mirrors)
    observed = ", ".join(f"{d}:{s.bytes}B/{s.reads}r" for d, s in sorted(log.served.items())) or "none"
    if not expect.mirrors:
        return Check("served", True, "", observed, "single drive: no per-drive statistics expected")
    if not log.served:
        return Check("served", False, f"{n} drives > 0", "none",
                     f"no 'MIRROR:' statistics line ({colibri.ENV_PROF}=1 was set; colibri prints it when a run ends)")
    names = ["primary"] + [f"mirror{k}" for k in range(1, n)]
    problems = [f"{names[d]} is not in the MIRROR: line" for d in range(n) if d not in log.served]
    problems += [f"{names[d]} served nothing" for d in range(n) if d in log.served and not log.served[d].reads]
    if log.read_error:
        problems.append("a mirror read failed and the primary served it")
    report = "; ".join(f"{names[d]} {s.bytes} B in {s.reads} reads" for d, s in sorted(log.served.items()) if d < n)
    return Check("served", not problems, f"{n} drives > 0", observed,
                 "; ".join(problems) + f" ({report})" if problems else report)


def confirm(text: str, expect: Expectation, returncode: int | None = 0) -> tuple[Check, ...]:
    """Judge a colibri log (stdout + stderr), one Check per name in CHECKS."""
    log = colibri.read_log(text)
    return (exit_check(returncode), _mirrors(log, expect), _weights(log, expect), _served(log, expect))
