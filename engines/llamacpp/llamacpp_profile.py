"""llama.cpp's profile (`engines.handoff.EngineProfile`): the arguments a plan gives it, the folder
of links that places its files across drives, the rules its loader would otherwise discover the
hard way, and whether a run's log proves the profile was applied (docs/engine-profiles.md). Pure.

llama.cpp takes no replicas: a plan over several drives is given to it as one model, a folder
of links named as its split loader derives them (`llamacpp_placement.link_names`), each to the
copy of that file on the drive the plan picked (`place_files`); `-m` names the folder's first
link. Its arguments are the common tools' (llama-completion, llama-cli, llama-server:
common/arg.cpp); llama-bench takes `-m` and `-lm` too but spells the repack switch `--repack 0`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..handoff import (
    NO_SOURCES,
    Check,
    Request,
    RunReading,
    Setting,
    SourceFacts,
    Violation,
    exit_check,
    lines_matching,
    list_rules,
    printed_step,
    unverified,
    weight_rules,
)
from . import constants as k
from .llamacpp_log import LINES, LoaderLog, read_log as read_loader_log
from .llamacpp_placement import link_names, place_files, split_parts

named_profiles = False      # llama.cpp has no knobs a named profile would layer
cache_experts = False       # no expert cache: the page cache is the kernel's
source_view = None          # it is given files
checks = ("exit", "model", "splits", "load-mode", "mapped", "timing")


def clear_prefix() -> str:
    """Inherited LLAMA_ARG_* variables stand in for arguments the profile leaves out: dropped."""
    return k.ENV_PREFIX


def profile_args() -> frozenset[str]:
    return k.PROFILE_ARGS


def plan_keys() -> tuple[str, ...]:
    return ()


def managed_keys(named: Iterable[str] = ()) -> tuple[str, ...]:
    return k.ENV_KEYS


def variant(facts: Sequence[SourceFacts]) -> str:
    return ""


def load_mode(switches: frozenset[str]) -> str:
    """The -lm value a plan's switches give (mmap unless a load-mode switch is on)."""
    on = [k.LOAD_MODES[s] for s in sorted(switches) if s in k.LOAD_MODES]
    return on[0] if on else k.LOAD_MMAP


# ---------------------------------------------------------------------------------------------
# Placement and links

def placement(request: Request) -> tuple[int, ...]:
    """The source serving each of the model's files (request.files order), by the plan's weights."""
    n = request.sources
    holders = []
    for name, _ in request.files:
        holders.append([s for s in range(n) if s == 0 or request.holds_of(s) is None or name in request.holds_of(s)])
    return place_files(request.files, request.prefill, holders)


def links(request: Request) -> tuple[tuple[str, str], ...]:
    """(link name, target) for each of the model's files: the name llama.cpp derives, pointing at
    the file in the folder of the source that serves it. None for a single source."""
    if request.sources < 2 or not request.files:
        return ()
    names = link_names([f for f, _ in request.files])
    folders = [posixpath.dirname(p) for p in request.paths]
    return tuple((name, posixpath.join(folders[s], rel))
                 for name, (rel, _), s in zip(names, request.files, placement(request)))


def model_arg(request: Request) -> str:
    """What -m names: the links folder's first link, else the primary itself."""
    ls = links(request)
    if ls and request.link_dir:
        return posixpath.join(request.link_dir, ls[0][0])
    return request.paths[0]


# ---------------------------------------------------------------------------------------------
# Export: the rules, the arguments, the env file's header

def check(facts: Sequence[SourceFacts], request: Request, *, allow_unverified: bool = False,
          manifest_size: int | None = None) -> list[Violation]:
    """Every rule llama.cpp's loader would refuse a model for ("model must be loaded with the first
    split", a missing sibling), or a folder of links could not be written for."""
    n = len(facts)
    if n == 0:
        return [NO_SOURCES]
    v = list_rules(facts, k.MAX_SOURCES, f"{n} sources but a plan for {k.NAME} places files on at most "
                                         f"{k.MAX_SOURCES} drives; drop a replica from the plan")
    v += weight_rules(n, request.prefill, request.decode, k.WEIGHT_MIN, k.WEIGHT_MAX)
    modes = sorted(s for s in request.switches if s in k.LOAD_MODES)
    if len(modes) > 1:
        v.append(Violation("load-mode", "switches", f"{' and '.join(modes)} are each a load mode (-lm); {k.NAME} "
                                                    "takes one: keep one switch"))
    primary = facts[0]
    if not primary.exists:
        v.append(Violation("missing", "sources[0]", f"primary {primary.path} does not exist"))
        return v
    if not primary.regular:
        v.append(Violation("not-regular", "sources[0]", f"primary {primary.path} is not a regular file: give "
                                                        "the model's GGUF file (the first split of a set)"))
        return v
    base = posixpath.basename(primary.path)
    parts = split_parts(base)
    if parts is not None and parts[1] != 1:
        v.append(Violation("not-first-split", "sources[0]", f"{primary.path} is split {parts[1]} of {parts[2]}; "
                                                            f"{k.NAME} loads a set from its first split "
                                                            f"({k.SPLIT_FORMAT % (parts[0], 1, parts[2])})"))
    if n > 1 and not request.files:
        v.append(Violation("files", "sources[0]", "the model's files are not known, so no drive can be chosen for "
                                                  "each; export from a rig whose model is readable"))
    seen = {}
    if primary.device is not None and primary.inode is not None:
        seen[(primary.device, primary.inode)] = 0
    for f in facts[1:]:
        where = f"sources[{f.index}]"
        if not f.exists or f.state == "missing":
            v.append(Violation("missing", where, f"replica {f.path} does not exist; run `replicas sync`"))
            continue
        if posixpath.basename(f.path) != base:
            v.append(Violation("name", where, f"replica {f.path} is not named {base} as the primary is; the links "
                                              "name each file as the primary's set does"))
        if f.holds is None and primary.size is not None and f.size != primary.size:
            v.append(Violation("size", where, f"replica {f.path} is {f.size} bytes, the primary {primary.size}; "
                                              "run `replicas repair` or `replicas sync`"))
        if f.device is not None and f.inode is not None:
            if (f.device, f.inode) in seen:
                v.append(Violation("same-inode", where, f"replica {f.path} is the same file (inode) as "
                                                        f"sources[{seen[(f.device, f.inode)]}]; a replica is a copy"))
            else:
                seen[(f.device, f.inode)] = f.index
        if f.state != "verified" and not allow_unverified:
            v.append(unverified(f, where))
    return v


def setting(request: Request) -> Setting:
    """No variables; the arguments: the model (the links folder's first link with several
    sources), the load mode, and --no-repack when asked."""
    argv = [k.ARG_MODEL, model_arg(request), k.ARG_LOAD_MODE, load_mode(request.switches)]
    if k.NO_REPACK in request.switches:
        argv.append(k.ARG_NO_REPACK)
    return Setting((), tuple(argv))


def header(request: Request, s: Setting) -> tuple[str, ...]:
    out = [f"engine arguments: {' '.join(s.argv)}"]
    ls = links(request)
    if ls:
        served = [0] * request.sources
        for (_, size), src in zip(request.files, placement(request)):
            served[src] += size
        out.append(f"{k.NAME} is given one model: the folder of {len(ls)} links {request.link_dir or '(not written)'}, "
                   "each file from the drive the plan picked; bytes per source "
                   + ", ".join(f"{p}: {b}" for p, b in zip(request.paths, served)))
    else:
        out.append(f"{k.NAME} reads the model from {request.paths[0]} (single source)")
    out.append(f"llama.cpp variables ({', '.join(k.ENV_KEYS)}) would stand in for arguments: the profile unsets them")
    return tuple(out)


def unset_note() -> str:
    return "llama.cpp variables that would stand in for the profile's arguments"


def given_by(argv: Sequence[str], environment: Mapping[str, str]) -> str:
    return f"{' '.join(argv)}"


def report_env(variant: str = "") -> dict[str, str]:
    """Verbosity 4: llama-completion prints the loader's lines only then."""
    return {k.ENV_VERBOSITY: k.REPORT_VERBOSITY}


def read_log(text: str, variant: str = "") -> LoaderLog:
    return read_loader_log(text)


# ---------------------------------------------------------------------------------------------
# Launch: what the log must show

@dataclass(frozen=True)
class Expectation:
    model: str              # the path -m names, as the loader prints it
    additional: int         # split files besides the first
    load_mode: str          # as load_tensors prints it
    mapped: bool            # weights stay file mappings (mmap without repack checks)


def expect(request: Request, environment: Mapping[str, str]) -> Expectation:
    files = len(request.files) or 1
    parts = split_parts(posixpath.basename(request.paths[0]))
    count = parts[2] if parts is not None else files
    mode = load_mode(request.switches)
    return Expectation(model_arg(request), count - 1, mode, mode == k.LOAD_MMAP)


def judge(text: str, expectation: Expectation, returncode: int | None = 0) -> tuple[Check, ...]:
    log = read_loader_log(text)
    want = expectation
    model_ok = log.model == want.model
    checks = [exit_check(returncode),
              Check("model", model_ok, want.model, log.model or "no loader line",
                    "loaded the path the profile gives" if model_ok else
                    "no 'loaded meta data ... from' line (is LLAMA_ARG_LOG_VERBOSITY=4 set?)" if log.model is None
                    else "loaded another model than the profile gives")]
    got = log.additional or 0
    checks.append(Check("splits", got == want.additional, str(want.additional), str(got),
                        f"loaded {got + 1} file(s) of the set" if got == want.additional else
                        "the loader found another number of split files"))
    checks.append(Check("load-mode", log.load_mode == want.load_mode and not log.dio_fallback, want.load_mode,
                        log.load_mode or "no load_tensors line",
                        "dio fell back to buffered reads" if log.dio_fallback else
                        "load mode applied" if log.load_mode == want.load_mode else "another load mode"))
    mapped, repacked = log.count("CPU_Mapped"), log.count("CPU_REPACK")
    if want.mapped:
        ok = mapped > 0 and repacked == 0
        checks.append(Check("mapped", ok, "CPU_Mapped buffers, no CPU_REPACK", f"{mapped} mapped, {repacked} repacked",
                            "the weights are the files' mappings, read from the drives as they are touched" if ok else
                            "repacked weights are copies in RAM, never read from the drives again: turn the "
                            f"{k.NO_REPACK} switch on" if repacked else "no mapped buffer line"))
    else:
        checks.append(Check("mapped", mapped == 0, "no CPU_Mapped buffer", f"{mapped} mapped",
                            "weights loaded into RAM, as the load mode asks" if mapped == 0 else
                            "weights still mapped from the files"))
    checks.append(Check("timing", log.eval is not None, "an eval time line", "present" if log.eval else "none",
                        "the run printed its timing" if log.eval else
                        "no timing line: the run was cut short before its end"))
    return tuple(checks)


def read_run(stdout: str, stderr: str, variant: str = "") -> RunReading:
    """The generated text (llama-completion with --no-display-prompt prints only it on stdout), the
    decode speed from the eval time line ('decode': over decode seconds alone), no per-drive
    counters (llama.cpp keeps none: the kernel faults the pages in)."""
    text = stdout + "\n" + stderr
    log = read_loader_log(text)
    tok_s = log.eval[2] if log.eval else None
    return RunReading(stdout if stdout.strip() else None, tok_s, "decode",
                      log.prompt[1] if log.prompt else None, (log.eval[1] + 1) if log.eval else None, {},
                      lines_matching(text, *LINES),
                      printed_step(log.eval_speed_text) if log.eval_speed_text else None)


def frozen_state(variant: str = "") -> tuple[dict[str, str], str]:
    return {}, f"{k.NAME} keeps no state between runs; the page cache is the kernel's (drop it between arms)"


def default_environment(environment: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
    """llama.cpp reads one drive without a profile: the primary's files alone."""
    return None

