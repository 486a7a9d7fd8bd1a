"""colibri's profile (`engines.handoff.EngineProfile`): the variables a plan gives colibri, the rules
its launcher and mirror code would otherwise discover the hard way, and whether a run's log proves
the profile was applied (docs/engine-profiles.md, "colibri"). Pure.

colibri runs each model family on its own engine (`family.FAMILY`), chosen by the model
directory's config.json `model_type` (`member_for`, as colibri's launcher does). The profile's
*variant* is that member's name; export and launch use its rules: how it parses
COLI_DISK_WEIGHTS (glm53: integers only), whether it stripes (only the GLM engine), the lines in
which it says which mirrors loaded and how it split the reads (`colibri_log`), and its per-drive
statistics line (`colibri_log.read_stats`; glm53 prints none, so its per-drive bytes cannot be
checked). This module is colibri's `Engine.profile`.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from core.errors import UsageError

from . import constants as c
from ..handoff import (
    NO_SOURCES,
    PHASES,
    Check,
    Request,
    RunReading,
    Setting,
    SourceFacts,
    SourceView,
    Violation,
    bad_characters,
    exit_check,
    idle_note,
    lines_matching,
    printed_step,
    list_rules,
    served_nothing,
    unverified,
    weight_rules,
)
from .colibri_log import LOG_STATS, STATS_LINE, MirrorLog, read_log, read_stats, split_shares
# the stand-in's side of the profile (engine_bridge.standin asks `Engine.profile` for both)
from .colibri_standin import standin_call as standin_call, standin_lines as standin_lines
from .family import DEFAULT_VARIANT, FamilyMember, member_for, member_of
from .mirror_env import plan_environment

named_profiles = False      # every colibri key comes from the plan; named profiles hold ds4 knobs
cache_experts = False       # colibri sizes its expert cache itself (--ram, COLI_RAM): no profile argument
checks = ("exit", "mirrors", "weights", "served")


def clear_prefix() -> str:
    return ""                # other COLI_* settings are the user's; the managed keys are cleared


def profile_args() -> frozenset[str]:
    return frozenset({c.ARG_MODEL})


def plan_keys() -> tuple[str, ...]:
    return c.ENV_KEYS


def managed_keys(named: Iterable[str] = ()) -> tuple[str, ...]:
    return c.ENV_KEYS


# ---------------------------------------------------------------------------------------------
# Which directory a plan source stands for, and which engine of the family runs the model

def shards(listing: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """The *.safetensors files colibri indexes in a directory (c/st.h st_scan_dir), with sizes."""
    return tuple(sorted((n, b) for n, b in listing if n.endswith(c.SHARD_SUFFIX)))


def source_view(path: str, is_dir: bool, listing: Sequence[tuple[str, int]], model_name: str = "") -> SourceView:
    """The directory colibri loads for a plan source, or why none: a directory member is the
    directory; a single-file member stands for its folder only when that folder holds no other
    shard (colibri loads every *.safetensors in it) and, for a replica, the file has the model's
    name (st_mirror_add looks a mirror's shard up by the model's basename). `listing`: the
    regular files (name, bytes) of the directory `path` is, or of the folder holding it;
    `model_name`: the model's file name when the primary is a file ('' for the primary itself)."""
    found = shards(listing)
    tokenizer = any(n == c.TOKENIZER for n, _ in listing)
    if is_dir:
        return SourceView(path, "", found, tokenizer)
    name, folder = posixpath.basename(path), posixpath.dirname(path)
    if not name.endswith(c.SHARD_SUFFIX):
        return SourceView("", f"{path} is not a directory of safetensors shards, which is all colibri loads "
                              "(give the model's directory, or export for ds4-argodrive)")
    if model_name and name != model_name:
        return SourceView("", f"{path} is not named {model_name} like the model, so colibri would not find it as "
                              "a mirror shard")
    others = [n for n, _ in found if n != name]
    if others:
        return SourceView("", f"colibri would load every shard in {folder}, not only {name} (also {others[0]}); "
                              "keep the model alone in its directory")
    return SourceView(folder, "", found, tokenizer)


def _member(primary: SourceFacts) -> tuple[FamilyMember | None, str]:
    """The family member colibri's launcher runs for the model directory, or why none."""
    d = primary.directory
    if primary.config == "":
        return None, (f"model directory {d} has no config.json; colibri's launcher picks its engine by its "
                      "model_type (c/family_registry.py resolve_model)")
    if primary.config != "ok":
        return None, f"{d}/config.json {primary.config}; colibri's launcher picks its engine by its model_type"
    try:
        return member_for(primary.model_type), ""
    except UsageError as e:
        return None, f"model directory {d}: {e}"



def variant(facts: Sequence[SourceFacts]) -> str:
    """The member that runs the model the primary's facts describe ('' when they cannot tell)."""
    if not facts or not facts[0].directory:
        return ""
    m, _ = _member(facts[0])
    return m.name if m else ""


# ---------------------------------------------------------------------------------------------
# Export: the rules, the environment, the env file's header

def check(facts: Sequence[SourceFacts], request: Request, *, allow_unverified: bool = False,
          manifest_size: int | None = None) -> list[Violation]:
    """colibri's rules (c/colibri.c mirror_setup, c/st.h st_mirror_add, c/coli need_model,
    c/family_registry.py): the model and every mirror are directories of safetensors shards; the
    model's config.json names a model_type colibri runs, and that engine's rules hold (glm53 reads
    integer weights only; only the GLM engine stripes); a mirror entry holds no ';' or ',', no edge
    blank, fits colibri's buffers and is not the model directory; at most 4 mirrors; every primary
    shard is in every mirror with its size (colibri would read a missing or different shard from
    the primary, against the plan's weights)."""
    n = len(facts)
    if n == 0:
        return [NO_SOURCES]
    v = list_rules(facts, c.MAX_SOURCES, f"{n} sources but colibri reads at most {c.MAX_MIRRORS} mirrors "
                                         "besides the model (ST_MAX_MIR); drop a replica from the plan")
    for f in facts:
        if f.path.startswith("/") and f.exists and f.not_loadable:
            v.append(Violation("not-a-directory-model", f"sources[{f.index}]", f.not_loadable))
    v += weight_rules(n, request.prefill, request.decode, c.WEIGHT_MIN, c.WEIGHT_MAX)
    primary = facts[0]
    if not primary.exists:
        v.append(Violation("missing", "sources[0]", f"model {primary.path} does not exist"))
    elif primary.directory and not primary.shards:
        v.append(Violation("no-shards", "sources[0]",
                           f"model directory {primary.directory} holds no *{c.SHARD_SUFFIX} shard for colibri to load"))
    elif primary.directory and not primary.tokenizer:
        v.append(Violation("no-tokenizer", "sources[0]",
                           f"model directory {primary.directory} has no {c.TOKENIZER}; colibri's coli launcher refuses it"))
    if primary.exists and primary.directory:
        v += _member_rules(primary, request)
    mirrors = [f.directory for f in facts[1:] if f.directory]
    if len(c.MIRROR_SEPARATOR.join(mirrors)) > c.MIRROR_LIST_MAX:
        v.append(Violation("mirror-list-length", "sources",
                           f"the mirror list is longer than the {c.MIRROR_LIST_MAX} characters colibri keeps; "
                           "use shorter directory paths"))
    for f in facts[1:]:
        v += _mirror_rules(f, primary, allow_unverified)
    return v


def _mirror_rules(f: SourceFacts, primary: SourceFacts, allow_unverified: bool) -> list[Violation]:
    """What colibri's mirror_setup and st_mirror_add ask of one mirror: it exists, its directory
    name survives the mirror list, it is not the model directory, its shard paths fit, it holds
    every shard of the model (or, a partial replica, the ones the rig says) at the model's sizes,
    and the manifest has vouched for it."""
    want = dict(primary.shards)
    v: list[Violation] = []
    where = f"sources[{f.index}]"
    lost = f.exists and f.directory and f.holds is not None and \
        any(b not in dict(f.shards) for b in want if b in _basenames(f.holds))
    if not f.exists or (f.state == "missing" and not lost):
        v.append(Violation("missing", where, f"replica {f.path} does not exist; run `replicas sync`"))
        return v
    d = f.directory
    if not d:
        return v
    found = bad_characters(d, c.PATH_FORBIDDEN)
    if found:
        v.append(Violation("bad-character", where,
                           f"{d!r} contains {' and '.join(repr(x) for x in found)}, which colibri uses as a separator "
                           f"in {c.ENV_MIRROR}; rename the directory"))
    if d != d.strip(" "):
        v.append(Violation("edge-blank", where, f"{d!r} starts or ends with a blank, which colibri trims away; rename "
                                                "the directory"))
    if d == primary.directory or (f.device is not None and (f.device, f.inode) == (primary.device, primary.inode)):
        v.append(Violation("same-directory", where,
                           f"replica {d} is the model directory itself; colibri ignores it (a mirror must be another copy)"))
        return v
    have = dict(f.shards)
    long = [b for b in want if len(f"{d}/{b}") > c.SHARD_PATH_MAX]
    if long:
        v.append(Violation("path-length", where, f"{d}/{long[0]} is longer than the {c.SHARD_PATH_MAX} "
                                                 "characters colibri can open; use a shorter directory path"))
    held = want if f.holds is None else {b: n for b, n in want.items() if b in _basenames(f.holds)}
    absent = [b for b in held if b not in have]
    if absent and f.holds is None:
        v.append(Violation("partial-mirror", where,
                           f"replica {d} lacks {len(absent)} of {len(want)} shards ({absent[0]}"
                           f"{', ...' if len(absent) > 1 else ''}); colibri would read them from the model drive; "
                           "run `replicas sync` (or `replicas sync --partial` to make it a partial replica the plan "
                           "is solved for)"))
    elif absent:
        v.append(Violation("partial-mirror", where,
                           f"partial replica {d} lacks {len(absent)} of the {len(held)} shards the rig says it holds "
                           f"({absent[0]}{', ...' if len(absent) > 1 else ''}); colibri would read them from the "
                           "model drive, against the plan's weights; run `replicas repair`"))
    resized = [b for b in want if b in have and have[b] != want[b]]
    if resized:
        v.append(Violation("size", where, f"replica {d}/{resized[0]} is {have[resized[0]]} bytes, the model's "
                                          f"{want[resized[0]]}; colibri would skip it; run `replicas repair`"))
    if f.state not in ("verified", "missing") and not allow_unverified:
        v.append(unverified(f, where))
    return v


def _basenames(files) -> set[str]:
    """The shard names among a partial replica's files (colibri looks a mirror's shard up by name)."""
    return {posixpath.basename(f) for f in files if f.endswith(c.SHARD_SUFFIX)}


def _member_rules(primary: SourceFacts, request: Request) -> list[Violation]:
    """The rules of the engine colibri runs for this model (its config.json model_type)."""
    m, why = _member(primary)
    if m is None:
        return [Violation("model-type", "sources[0]", why)]
    v = []
    if m.integer_weights:
        odd = [w for w in request.prefill if isinstance(w, bool) or not isinstance(w, int)]
        if odd:
            v.append(Violation("integer-weights", "prefill.weights",
                               f"colibri's {m.name} engine ({m.source}) reads {c.ENV_WEIGHTS} with strtol: integers "
                               f"only, not {odd[0]!r}"))
    if c.STRIPE in request.switches and not m.stripes:
        v.append(Violation("stripe", "switches",
                           f"the plan stripes reads, but colibri's {m.name} engine ({m.source}, model_type "
                           f"{primary.model_type!r}) never stripes; its predictions assume striping: solve the plan "
                           f"again without the {c.STRIPE} switch"))
    return v


def setting(request: Request) -> Setting:
    """COLI_MODEL and SNAP (the model directory), the mirror list and one weight per drive (the
    plan's base weights: colibri places whole experts once for every phase), striping when the
    plan stripes; no arguments (--model is COLI_MODEL)."""
    p = request.paths
    return Setting(plan_environment(p[0], p[1:], request.prefill, request.switches), ())


def header(request: Request, s: Setting) -> tuple[str, ...]:
    env = dict(s.environment)
    m = member_of(request.variant)
    lines = [f"colibri: the coli launcher reads {c.ENV_MODEL}, the engine binary {c.ENV_SNAP} "
             f"(both the model directory); {c.ENV_MIRROR} lists mirror directories ('{c.MIRROR_SEPARATOR}'-separated);",
             f"{c.ENV_WEIGHTS} are the plan's base weights {':'.join(map(str, request.prefill))} "
             "(colibri places whole experts by a hash of (layer, expert); it has no separate decode split)"]
    if request.variant:
        lines.append(f"engine: colibri's {m.name} ({m.source}), which its launcher runs for this model's "
                     "config.json model_type")
    for i, path in enumerate(request.paths[1:], 1):
        holds = request.holds_of(i)
        if holds is not None:
            lines.append(f"mirror {i} {path} is a partial replica holding {len(_basenames(holds))} shard(s) "
                         f"({', '.join(sorted(_basenames(holds)))}); colibri reads the others from the model drive "
                         "(c/st.h st_mirror_add); the weights were solved for what it holds")
    if env.get(c.ENV_STRIPE) == "0":
        lines.append(f"O_DIRECT reads ({c.ENV_DIRECT}=1) without striping ({c.ENV_STRIPE}=0: unset, colibri would stripe)")
    if env.get(c.ENV_STRIPE) == "1":
        lines.append(f"striping: {c.ENV_DIRECT}=1 (O_DIRECT, the only path that stripes) and "
                     f"{c.ENV_STRIPE}=1 cut each expert read of 4 MiB or more over every drive")
    return tuple(lines)


def unset_note() -> str:
    return "colibri variables this profile does not want: an inherited mirror list, a split layout, striping"


def given_by(argv: Sequence[str], environment: Mapping[str, str]) -> str:
    return f"{c.ENV_MODEL}={dict(environment).get(c.ENV_MODEL, '')}"


# ---------------------------------------------------------------------------------------------
# Launch: the log lines of each member of the family

def report_env(variant: str = "") -> dict[str, str]:
    """PROF=1: colibri's docs ask it for the MIRROR: statistics (docs/multidisk.md). DeepSeek V4.1's
    serve loop prints its per-turn MIRROR: line only with V41_STATS=1 (c/deepseek_v41.c)."""
    env = {c.ENV_PROF: "1"}
    if (variant or DEFAULT_VARIANT) == "deepseek_v41":
        env[c.ENV_V41_STATS] = "1"
    return env




@dataclass(frozen=True)
class MirrorExpectation:
    mirrors: tuple[str, ...]     # mirror directories, in COLI_MODEL_MIRROR order
    weights: tuple[int, ...]     # one per drive, primary first (() for a single drive)
    stripe: bool = False         # the profile asked for striping (DIRECT=1, COLI_MIR_STRIPE=1)
    variant: str = ""            # the family member that runs the model ('' : GLM)
    idle: tuple[tuple[str, ...], ...] = ()   # per drive: phases in which the plan gives it nothing
    shards: tuple[int | None, ...] = ()      # per mirror: the shards a partial replica holds (None: every one)
    probe: bool = False          # mirrors without COLI_DISK_WEIGHTS: colibri measures the drives and splits itself


def expect(request: Request, environment: Mapping[str, str]) -> MirrorExpectation:
    env = dict(environment)
    probe = request.sources > 1 and c.ENV_WEIGHTS not in env
    weights = tuple(request.prefill) if request.sources > 1 and not probe else ()
    shards = tuple(None if request.holds_of(i) is None else len(_basenames(request.holds_of(i)))
                   for i in range(1, request.sources))
    shards = shards if any(x is not None for x in shards) else ()
    return MirrorExpectation(mirrors=tuple(request.paths[1:]), weights=weights, stripe=env.get(c.ENV_STRIPE) == "1",
                       variant=request.variant, idle=() if probe else request.idle, shards=shards, probe=probe)


def _mirrors(log: MirrorLog, expect: MirrorExpectation) -> Check:
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
            problems.append(f"mirror {want} did not load" + (f" ({why[-1]})" if why else " (no line saying it loaded)"))
            continue
        m = got[-1]
        partial = expect.shards[k - 1] if k - 1 < len(expect.shards) else None
        if m.shards < (m.total if partial is None else partial):
            problems.append(f"mirror {want} loaded {m.shards}/{m.total} shards"
                            + (f", the partial replica holds {partial}" if partial is not None else "")
                            + "; colibri reads the others from the primary")
        if m.replica != k:
            problems.append(f"mirror {want} is drive {m.replica}, not {k}: an earlier mirror did not load, "
                            "so the weights no longer line up with the drives")
    problems += [f"colibri skipped {path} ({what} differs from the primary)" for path, what in log.files_skipped]
    expected = f"{len(expect.mirrors)} mirror(s), every shard" if not any(x is not None for x in expect.shards) else \
        f"{len(expect.mirrors)} mirror(s), " + ", ".join("every shard" if x is None else f"{x} shard(s)" for x in expect.shards)
    return Check("mirrors", not problems, expected, observed,
                 "; ".join(problems) if problems else f"every mirror loaded whole ({len(expect.mirrors)})")


def _weights(log: MirrorLog, expect: MirrorExpectation) -> Check:
    if expect.probe:
        seen = "/".join(log.split) if log.split else "none"
        if log.drives is None:
            return Check("weights", False, "probe", "none", "no line saying how colibri split the reads")
        if log.drives != 1 + len(expect.mirrors):
            return Check("weights", False, "probe", seen, f"colibri reads {log.drives} drive(s), the profile gives "
                                                          f"{1 + len(expect.mirrors)}")
        ok = log.split_how != c.HOW_WEIGHTS
        return Check("weights", ok, "probe", seen, f"no {c.ENV_WEIGHTS}: colibri split the reads by '{log.split_how}'"
                     if ok else f"colibri took {c.ENV_WEIGHTS} though the profile sets none (an inherited variable?)")
    if not expect.weights:
        return Check("weights", True, "", "", "single drive: no weights")
    want = "/".join(split_shares(expect.variant, expect.weights))
    seen = "/".join(log.split) if log.split else "none"
    if log.weights_rejected is not None:
        return Check("weights", False, want, f"rejected {log.weights_rejected}",
                     f"colibri rejected {c.ENV_WEIGHTS}={log.weights_rejected} (it wanted {log.weights_wanted} "
                     "weights, one per drive that loaded) and probed the drives instead")
    if log.drives is None:
        return Check("weights", False, want, "none", "no line saying how colibri split the reads: the split is unconfirmed")
    if log.drives != len(expect.weights):
        return Check("weights", False, want, seen,
                     f"colibri reads {log.drives} drive(s), the profile gives {len(expect.weights)} weights")
    if log.split_how != c.HOW_WEIGHTS:
        return Check("weights", False, want, seen, f"colibri split the reads by '{log.split_how}', not by {c.ENV_WEIGHTS}")
    ok = seen == want
    return Check("weights", ok, want, seen,
                 "colibri applied the weights (percent of experts per drive)" if ok
                 else "colibri's read split differs from the weights' cuts")


def _served(log: MirrorLog, expect: MirrorExpectation) -> Check:
    n = 1 + len(expect.mirrors)
    m = member_of(expect.variant)
    observed = ", ".join(f"{d}:{s.bytes}B/{s.reads}r" for d, s in sorted(log.served.items())) or "none"
    if not expect.mirrors:
        return Check("served", True, "", observed, "single drive: no per-drive statistics expected")
    idle_of = {d: tuple(expect.idle[d]) for d in range(min(n, len(expect.idle))) if expect.idle[d]}
    names = ["primary"] + [f"mirror{k}" for k in range(1, n)]
    expected = f"{n} drives > 0" + (f" (idle: {', '.join(f'{names[d]} {idle_note(p)}' for d, p in idle_of.items())})"
                                    if idle_of else "")
    if m.stats is None:
        return Check("served", True, expected, "none",
                     f"per-drive bytes could not be checked: colibri's {m.name} engine ({m.source}) prints no "
                     "per-drive counters; its mirror and split lines above are what it confirms")
    if not log.served:
        asked = ", ".join(f"{k}={v}" for k, v in report_env(expect.variant).items())
        return Check("served", False, expected, "none",
                     f"no '{STATS_LINE.get(m.name, 'MIRROR:')}' statistics line from colibri's {m.name} engine "
                     f"({m.source}, on {m.stats}; {asked} was set; it prints it when a run ends)")
    problems = [f"{names[d]} is not in the statistics line" for d in range(n) if d not in log.served]
    notes = []
    for d in range(n):
        s = log.served.get(d)
        if s is None:
            continue
        phases = idle_of.get(d, ())
        if not s.reads and expect.probe:      # colibri's own split may leave a small drive's slice untouched
            notes.append(f"{names[d]} served nothing under colibri's own split")
        elif not s.reads:
            ok, say = served_nothing(names[d], phases)
            (notes if ok else problems).append(say)
        elif set(phases) >= set(PHASES):
            notes.append(f"{names[d]} served {s.bytes} B though the plan gives it nothing {idle_note(phases)}")
    if log.read_error:
        problems.append("a mirror read failed and the primary served it")
    report = "; ".join(f"{names[d]} {s.bytes} B in {s.reads} reads" for d, s in sorted(log.served.items()) if d < n)
    detail = "; ".join(problems + notes) + f" ({report})" if problems or notes else report
    return Check("served", not problems, expected, observed, detail)


def judge(text: str, expectation: MirrorExpectation, returncode: int | None = 0) -> tuple[Check, ...]:
    """Judge a colibri log (stdout + stderr), one Check per name in `checks`, with the lines of
    the member that ran (`expectation.variant`)."""
    log = read_log(text, expectation.variant)
    return (exit_check(returncode), _mirrors(log, expectation), _weights(log, expectation), _served(log, expectation))


# ---------------------------------------------------------------------------------------------
# The real-engine tuner: what a run says besides what it applied, and the state it keeps

# c/colibri.c main, oracle mode (REF=): the generated ids, then the hit-rate line whose last field is
# the generated tokens over generate()'s seconds (prefill and decode); the prefill progress line
# names the prompt's tokens.
_GLM_TOKENS = re.compile(r"^GLM C engine\s*:\s*([\d ]*\d)\s*$", re.M)
_GLM_SPEED = re.compile(r"^Expert cache hit rate: .*\|\s*([\d.]+) tok/s\s*$", re.M)
_GLM_PROMPT = re.compile(r"^\[prefill\] layer \d+/\d+ \S+ (\d+) token", re.M)
# c/deepseek_v41.c main, reference mode (`binary CAP REF.json`): the ids on stdout, one line; on stderr
# '[v41] prefill N tokens in Xs | decode M in Ys (Z tok/s)' (Z: decode alone).
_V41_TOKENS = re.compile(r"^(\d+(?: \d+)*)\s*$", re.M)
_V41_SPEED = re.compile(r"^\[v41\] prefill (\d+) tokens in [\d.]+s \| decode (\d+) in [\d.]+s \(([\d.]+) tok/s\)", re.M)


def read_run(stdout: str, stderr: str, variant: str = "") -> RunReading:
    """The run's output and speed as the member prints them in its deterministic mode (the GLM
    engine's oracle mode, REF=; DeepSeek V4.1's reference mode), and its per-drive bytes
    (`read_stats`). The V4 and GLM-5.3 engines' output lines are not read (output None)."""
    m = member_of(variant)
    text = stdout + "\n" + stderr
    served = {d: s.bytes for d, s in read_stats(m, text).items()}
    counters = lines_matching(text, LOG_STATS, re.compile(r"^v4_mirror"))
    if m.name == "glm":
        ids = _GLM_TOKENS.findall(stdout)
        speed = _GLM_SPEED.findall(stdout)
        prompt = _GLM_PROMPT.findall(stderr)
        out = ids[-1].strip() if ids else None
        return RunReading(out, float(speed[-1]) if speed else None, "run", int(prompt[-1]) if prompt else None,
                          len(out.split()) if out else None, served,
                          lines_matching(stdout, _GLM_SPEED) + counters, printed_step(speed[-1]) if speed else None)
    if m.name == "deepseek_v41":
        ids = _V41_TOKENS.findall(stdout)
        speed = _V41_SPEED.findall(stderr)
        out = ids[-1].strip() if ids else None
        p, g, tps = speed[-1] if speed else (None, None, None)
        return RunReading(out, float(tps) if tps else None, "decode", int(p) if p else None,
                          int(g) if g else (len(out.split()) if out else None), served,
                          lines_matching(stderr, _V41_SPEED) + counters, printed_step(tps) if tps else None)
    return RunReading(None, None, "run", None, None, served, counters)


def frozen_state(variant: str = "") -> tuple[dict[str, str], str]:
    """USAGE_SAVE=0 asks colibri not to write its usage history (`.coli_usage` in the model
    directory, which later runs pin experts by). Only some engines read it (c/telemetry.h
    `usage_save` is called from inkling.c and kimi_k3.c); the GLM engine at 4ef9a99 does not, but
    in its oracle mode (REF=) it writes no usage file; the tuner checks the model directories
    are unchanged after every arm either way."""
    m = member_of(variant)
    which = ("the GLM engine ignores it; its oracle mode writes none" if m.name == "glm" else
             f"whether the {m.name} engine reads it is unconfirmed; the model directories are checked after every arm")
    return ({c.ENV_USAGE_SAVE: "0"},
            f"colibri's {m.name} engine keeps a usage history ({c.USAGE_FILE} in the model directory) that pins "
            f"experts in later runs; {c.ENV_USAGE_SAVE}=0 is set ({which})")


def links(request: Request) -> tuple[tuple[str, str], ...]:
    """None: the engine is given its sources themselves, not a folder of links."""
    return ()


def default_environment(environment: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """The same model and mirrors without weights or switches: colibri probes the drives at startup
    and picks its own split (mirror_setup: '(measured)'), reading whole experts through the page cache."""
    drop = {c.ENV_WEIGHTS, c.ENV_DIRECT, c.ENV_STRIPE}
    return tuple((k, v) for k, v in environment if k not in drop)


