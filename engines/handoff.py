"""An engine's profile: what `engine-bridge export` writes for an engine and how `engine-bridge
launch` proves from the engine's log that it was applied (docs/engine-profiles.md). Pure.

Export and launch never test an engine's name; they ask `Engine.profile`, which each engine's
module fills with an object giving `EngineProfile` (ds4-argodrive: `engines.ds4_argodrive_profile`,
colibri: `engines.colibri_profile`). The nouns they exchange live here, with the rules every engine
shares:

- `SourceFacts`: what the disk says about one source of a plan (gathered by export, judged here);
- `Request`: a plan's sources, weights and switches as the engine is given them, with the user's
  options (cache size, named profile) and, for launch, which sources the plan leaves idle;
- `Setting`: the environment and arguments a request gives;
- `Violation`: one rule a plan breaks (export refuses, in one line naming every violation);
- `Check`: one thing a launch log confirms or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Protocol, Sequence

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class SourceFacts:
    """What the disk says about one source of a plan (gathered by export, judged by the engine)."""
    index: int                  # 0 = primary, then replicas in engine order
    path: str
    exists: bool = True
    regular: bool = True
    size: int | None = None     # bytes
    device: int | None = None
    inode: int | None = None
    state: str = ""             # replicas: 'verified' | 'stale' | 'unverified' | 'missing'; primary: ''
    # An engine that loads directories (`EngineProfile.source_view`): the one this source stands
    # for ('' when it stands for none), why not when it does not, its model files the engine
    # loads (basename, bytes), whether it has the tokenizer the engine's launcher requires,
    # and its config.json: '' absent, 'ok', or why it could not be read; its model_type.
    directory: str = ""
    not_loadable: str = ""
    shards: tuple[tuple[str, int], ...] = ()
    tokenizer: bool = False
    config: str = ""
    model_type: str | None = None
    # A partial replica (the rig's rig.toml `holds`): the model's files it holds; None: every file.
    holds: tuple[str, ...] | None = None


@dataclass(frozen=True)
class SourceView:
    """What a directory-loading engine makes of one source: the directory it loads ('' none, and
    why not), the model files it loads there (basename, bytes) and whether its tokenizer is there."""
    directory: str
    not_loadable: str = ""
    shards: tuple[tuple[str, int], ...] = ()
    tokenizer: bool = False


@dataclass(frozen=True)
class Request:
    """What export (and launch) asks an engine's profile about: a checked plan's sources as the
    engine is given them, its weights and switches, and the user's options."""
    paths: tuple[str, ...]                      # primary first: files, or the directories the engine loads
    prefill: tuple[int, ...]                    # base weights, one per source
    decode: tuple[int, ...]                     # decode weights, one per source
    switches: frozenset[str] = frozenset()      # the plan's switches that are on (the engine's own names)
    cache_experts: int | None = None            # experts (engines whose profile takes a cache size)
    named: tuple[tuple[str, str], ...] = ()     # a named profile's environment (engines that take one)
    variant: str = ""                           # the engine variant that runs the model ('' none)
    # per source: the phases in which the plan gives it nothing (launch: an expected-idle drive)
    idle: tuple[tuple[str, ...], ...] = ()
    # per source: the model's files a partial replica holds (None, or no entry: every file)
    holds: tuple[tuple[str, ...] | None, ...] = ()
    # engines placed by files (`EngineProfile.links`): the model's files (name relative to the
    # primary's folder, bytes), and the folder export writes the engine's links into ('' none)
    files: tuple[tuple[str, int], ...] = ()
    link_dir: str = ""

    @property
    def sources(self) -> int:
        return len(self.paths)

    def holds_of(self, source: int) -> tuple[str, ...] | None:
        return self.holds[source] if source < len(self.holds) else None


@dataclass(frozen=True)
class Setting:
    """The environment (in export order) and arguments (after the binary) a request gives."""
    environment: tuple[tuple[str, str], ...]
    argv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Violation:
    rule: str        # short id, e.g. 'too-many-sources', 'unverified'
    where: str       # e.g. 'sources[2]' or 'decode.weights'
    reason: str      # one sentence: what, and how to fix

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    expected: str
    observed: str
    detail: str


class EngineProfile(Protocol):
    """What an engine's profile gives export and launch (`Engine.profile`). Every member is pure."""

    named_profiles: bool        # takes named profiles (io-base, ...) layered under the plan's keys
    cache_experts: bool         # takes, and needs, an expert-cache size (--cache-experts)
    checks: tuple[str, ...]     # the names of the launch confirmations, in order
    # directory-loading engines: (path, is_dir, listing of the folder it is or is in, the model's
    # file name when the primary is a file) -> SourceView; None: the engine is given files
    source_view: Any

    def clear_prefix(self) -> str:
        """Launch drops every inherited variable starting so ('' none)."""

    def profile_args(self) -> frozenset[str]:
        """Arguments the profile gives; refused after `--`."""

    def plan_keys(self) -> tuple[str, ...]:
        """Variables only a plan sets; a named profile may not."""

    def managed_keys(self, named: Iterable[str] = ()) -> tuple[str, ...]:
        """Every variable a profile speaks for (sets, or unsets), given the keys named profiles use."""

    def variant(self, facts: Sequence[SourceFacts]) -> str:
        """The engine variant that runs the model the facts describe ('' none or unknown)."""

    def check(self, facts: Sequence[SourceFacts], request: Request, *, allow_unverified: bool = False,
              manifest_size: int | None = None) -> list[Violation]:
        """Every rule the engine would otherwise discover the hard way (or ignore with a log line)."""

    def setting(self, request: Request) -> Setting:
        """The environment and arguments for a checked request."""

    def header(self, request: Request, environment: Sequence[tuple[str, str]]) -> tuple[str, ...]:
        """The env file's comment lines (without '# ') saying what the variables mean."""

    def unset_note(self) -> str:
        """What the env file's unset lines clear, for its 'load with' comment."""

    def given_by(self, argv: Sequence[str], environment: Mapping[str, str]) -> str:
        """How the profile gives the engine its model (for a refused argument's message)."""

    def report_env(self, variant: str = "") -> dict[str, str]:
        """What the launcher adds so the engine prints what it applied."""

    def read_log(self, text: str, variant: str = "") -> Any:
        """Every line of a run's log in which the engine says what it applied."""

    def expect(self, request: Request, environment: Mapping[str, str]) -> Any:
        """What a launch of this request must show in the log."""

    def judge(self, text: str, expectation: Any, returncode: int | None = 0) -> tuple[Check, ...]:
        """One Check per name in `checks` (some only when asked for), judged on the log."""

    def read_run(self, stdout: str, stderr: str, variant: str = "") -> "RunReading":
        """The run's output, speed and per-drive counters as the engine prints them (the tuner's arms)."""

    def frozen_state(self, variant: str = "") -> tuple[dict[str, str], str]:
        """(variables that stop the engine learning from a run, what it keeps and where that is said)."""

    def links(self, request: Request) -> tuple[tuple[str, str], ...]:
        """(name, target) of each link export writes into `request.link_dir` for the engine to be
        given that folder's first file (an engine placed by files); () for an engine given the
        sources themselves."""

    def default_environment(self, environment: Sequence[tuple[str, str]]) -> tuple[tuple[str, str], ...] | None:
        """A profile's environment as the engine runs by default over the same drives (no weights, no
        switches); None when the engine takes no replicas without weights (its default: the primary alone)."""


# ---------------------------------------------------------------------------------------------
# Rules every engine shares

NO_SOURCES = Violation("no-sources", "sources", "the plan names no sources; re-create it with `planner solve`")


def list_rules(facts: Sequence[SourceFacts], limit: int, too_many: str) -> list[Violation]:
    """What every engine asks of its source list: at most `limit` sources (`too_many` says why
    not), each an absolute path."""
    v = [Violation("too-many-sources", "sources", too_many)] if len(facts) > limit else []
    v += [Violation("relative-path", f"sources[{f.index}]", f"{f.path!r} is not an absolute path; the engine needs one")
          for f in facts if not f.path.startswith("/")]
    return v


def unverified(f: SourceFacts, where: str) -> Violation:
    """A replica the manifest has not vouched for (never verified, or changed since)."""
    how = ("was modified since it was verified" if f.state == "stale"
           else "has never been verified against the manifest")
    return Violation("unverified", where, f"replica {f.path} {how}; run `replicas verify` (or export with --allow-unverified)")


def weight_ok(w, lo: int, hi: int) -> bool:
    return isinstance(w, int) and not isinstance(w, bool) and lo <= w <= hi


def weight_rules(n: int, prefill: Sequence, decode: Sequence, lo: int, hi: int) -> list[Violation]:
    """One weight per source in each phase, each an integer lo..hi."""
    v = []
    for phase, weights in (("prefill.weights", prefill), ("decode.weights", decode)):
        if len(weights) != n:
            v.append(Violation("weight-count", phase,
                               f"{len(weights)} weights for {n} sources (the engine ignores a wrong count "
                               "and only logs that it did); "
                               "give exactly one weight per source"))
        for i, w in enumerate(weights):
            if not weight_ok(w, lo, hi):
                v.append(Violation("weight-range", f"{phase}[{i}]", f"weight {w!r} is not an integer {lo}..{hi}"))
    return v


def bad_characters(path: str, forbidden: str) -> list[str]:
    return sorted({c for c in path if c in forbidden})


def check_cache(cache_experts) -> list[Violation]:
    if cache_experts is None:
        return [Violation("no-cache", "cache_experts",
                          "no expert-cache size: pass --cache-experts N or use a profile that sets cache_experts")]
    if isinstance(cache_experts, bool) or not isinstance(cache_experts, int) or cache_experts <= 0:
        return [Violation("cache-range", "cache_experts", f"{cache_experts!r} must be a positive integer (experts)")]
    return []


# ---------------------------------------------------------------------------------------------
# Verdicts every engine shares

def exit_check(returncode: int | None) -> Check:
    if returncode == 0:
        return Check("exit", True, "0", "0", "engine exited cleanly")
    seen = "timeout" if returncode is None else str(returncode)
    why = ("engine was stopped after the timeout" if returncode is None
           else f"engine was killed by signal {-returncode}" if returncode < 0
           else f"engine exited with code {returncode}")
    return Check("exit", False, "0", seen, why)


def idle_note(phases: Sequence[str]) -> str:
    """How a drive the plan leaves idle is described: 'in decode', 'in prefill and decode'."""
    return "in " + " and ".join(phases)


def served_nothing(source: str, phases: Sequence[str]) -> tuple[bool, str]:
    """A drive that served nothing: expected when the plan leaves it idle in some phase (a run's
    counters cover every phase together, so a run that only exercised that phase reads nothing
    from it); else a failure. (ok, what to say)."""
    if phases:
        return True, f"{source} served 0 bytes, expected idle: the plan gives it nothing {idle_note(phases)}"
    return False, f"{source} served nothing"


# ---------------------------------------------------------------------------------------------
# What a run says besides what it applied: its output and its speed (the real-engine tuner)

@dataclass(frozen=True)
class RunReading:
    """What one run printed about its work, read by the engine's own profile (`read_run`): its
    output as printed (the generated token ids or text; None when it printed none this reader
    knows), its speed by its own clock (tok/s; None when it printed none), what that speed counts
    (`speed_kind`: 'run' = generated tokens over prefill + decode seconds, 'decode' = over decode
    seconds alone), the prompt and generated tokens it reports, bytes per drive from its own
    counters ({} when it prints none) and the lines all this was read from, as printed."""
    output: str | None
    tok_s: float | None
    speed_kind: str = "run"
    prompt_tokens: int | None = None
    gen_tokens: int | None = None
    served: Mapping[int, int] = field(default_factory=dict)
    lines: tuple[str, ...] = ()
    resolution: float | None = None     # tok/s: the step of the printed speed (one decimal: 0.05)


def printed_step(number: str) -> float:
    """Half the last printed digit's step of a number as printed ('14.1' -> 0.05, '3' -> 0.5)."""
    decimals = len(number.split(".", 1)[1]) if "." in number else 0
    return 0.5 * 10.0 ** -decimals


def last_match(rx, text: str):
    """The last match of the compiled `rx` in an engine's log (its groups, as findall gives them),
    or None: an engine that prints a line again prints what it applied last."""
    found = rx.findall(text)
    return found[-1] if found else None


def lines_matching(text: str, *patterns) -> tuple[str, ...]:
    """Every line of `text` matched by one of the compiled `patterns`, in order, stripped."""
    return tuple(ln.strip() for ln in text.splitlines() if any(p.search(ln) for p in patterns))


# ---------------------------------------------------------------------------------------------
# The stand-in: the embedded engine behind a real engine's interface (engine_bridge.standin)
#
# The engine's profile reads its call as the engine would (`standin_call`: environment and
# arguments in, the sources it would read, its weights, switches, cache, prompt and the lines it
# prints while it sets up) and prints its lines once the run is done (`standin_lines`). The run
# itself, reads and compute, is the embedded engine's.

@dataclass(frozen=True)
class StandinCall:
    """What one call of the engine asks for, as the engine reads its environment and arguments.
    error: the one line it stops with (rc its exit code) before running; weights None with more
    than one source: the engine measures the drives itself (`probe`)."""
    sources: tuple[str, ...] = ()                   # model paths the engine reads, primary first
    weights: tuple[int, ...] | None = None          # base (prefill) weights, one per source
    decode_weights: tuple[int, ...] | None = None   # None: the base weights
    switches: frozenset[str] = frozenset()          # the engine's switches on, as it reads them from its call
    cache_experts: int = 0                          # experts in RAM over the whole model
    cache_per_layer: int = 0                        # as the engine was asked (0: it takes the model's total)
    reference: str = ""                             # a reference file (prompt ids, expected output) to read
    prompt_key: str = "prompt_ids"
    expected_key: str = ""                          # the reference's key of the expected output ids ('' none)
    full_key: str = ""                              # ... or of prompt + output ids together
    prompt_tokens: int = 0                          # without a reference: this many deterministic prompt ids
    gen_tokens: int = 0
    prompt_seed: int = 0
    stderr: tuple[str, ...] = ()                    # lines printed while setting up
    stdout: tuple[str, ...] = ()
    error: str = ""
    rc: int = 0
    variant: str = ""
    report: bool = True                             # print the per-drive statistics
    how: str = ""                                   # how the weights were chosen, as its split line says


@dataclass(frozen=True)
class StandinRun:
    """What the embedded engine did for a call: the prompt and output ids, the phases' seconds,
    the cache's hits and misses, per source (bytes, reads, lands_last, gap_ns), the weights it read
    with and how they were chosen ('COLI_DISK_WEIGHTS', 'measured', ...)."""
    prompt: tuple[int, ...]
    output: tuple[int, ...]
    expected: tuple[int, ...] | None
    prefill_s: float
    decode_s: float
    hits: int
    misses: int
    sources: tuple[tuple[int, int, int, int], ...]
    weights: tuple[int, ...]
    how: str
    layers: int
    experts: int
    model_type: str = ""
