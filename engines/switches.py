"""An engine's switches: the settings, besides its weights, that change what it reads (pure).

A switch is a name the engine declares (colibri's O_DIRECT reads and its stripes, a load mode, a
prefetch pool). Everything above engines/ carries the switches that are on as one value, a
`frozenset` of names, in plans, setups, requests, the tuner's candidates and the harness's arms,
and never names one: what a name means to the reads, the profile and the log is the engine's own
(its pattern, its profile and its log lines read the set), and which sets are legal is asked of
the engine's `Switches` here.

In a plan file (schema 3) the set is one key, `"switches": [names...]`, sorted. Plans and
predictions written before it (plan schema 2) held one true/false key per switch, named after it;
`Switches.read` reads both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from core.errors import UsageError

NAME_RE = re.compile(r"^[a-z][a-z0-9-]*$")      # a switch name, as typed after --switch


@dataclass(frozen=True)
class Switch:
    """One switch an engine declares."""
    name: str                           # as typed after --switch and kept in plans
    what: str                           # one clause: what turning it on does, in the engine's terms
    needs: tuple[str, ...] = ()         # switches that must be on with this one
    why: str = ""                       # one clause: why it needs them

    def __post_init__(self):
        if not NAME_RE.match(self.name):
            raise ValueError(f"switch name {self.name!r}: lower-case letters, digits and '-', starting with a letter")


@dataclass(frozen=True)
class Switches:
    """The switches an engine declares and its rules for which sets of them are legal."""
    declared: tuple[Switch, ...] = ()

    def __post_init__(self):
        names = [s.name for s in self.declared]
        if len(set(names)) != len(names):
            raise ValueError(f"switches {names}: a name is declared twice")
        for s in self.declared:
            unknown = [n for n in s.needs if n not in names]
            if unknown:
                raise ValueError(f"switch {s.name} needs {unknown[0]!r}, which is not declared")

    @property
    def names(self) -> tuple[str, ...]:
        """The declared names, in the engine's order."""
        return tuple(s.name for s in self.declared)

    def __bool__(self) -> bool:
        return bool(self.declared)

    def get(self, name: str) -> Switch | None:
        return next((s for s in self.declared if s.name == name), None)

    def problem(self, on: Iterable[str], engine: str, option: str = "--switch") -> str:
        """'' when `on` is a set the engine takes, else one line saying what is wrong (an unknown
        name, a switch without one it needs), as `option NAME` where the user typed it."""
        on = set(on)
        for name in sorted(on):
            if name not in self.names:
                has = f"the switches {', '.join(self.names)}" if self.names else "no switches"
                return f"{option} {name}: {engine} has {has}"
        for s in self.declared:
            if s.name in on:
                for need in s.needs:
                    if need not in on:
                        return f"{option} {s.name} needs {option} {need}" + (f": {s.why}" if s.why else "")
        return ""

    def check(self, on: Iterable[str], engine: str, option: str = "--switch") -> frozenset[str]:
        """`on` as the value the stages carry; UsageError (one line) when the engine does not take it."""
        out = frozenset(on)
        why = self.problem(out, engine, option)
        if why:
            raise UsageError(why)
        return out

    def parse(self, given: Iterable[str], engine: str, option: str = "--switch") -> frozenset[str]:
        """Switches as typed: each `option` once per name or as a comma-separated list, checked."""
        return self.check((n.strip() for g in given for n in str(g).split(",") if n.strip()), engine, option)

    def read(self, record: Mapping) -> frozenset[str]:
        """The switches a record says are on (a plan file, a solver's prediction, a profile's copy of
        its plan): its `switches` list; in a record written before that key, one true/false key per
        switch, named after it, and a switch whose key is absent is on when one that needs it is (a
        plan from before the needed switch was recorded had it on by the engine's rule)."""
        if "switches" in record:
            return frozenset(str(n) for n in record.get("switches") or ())
        on = {s.name for s in self.declared if record.get(s.name) is True}
        for s in self.declared:
            if s.name in on:
                on |= {n for n in s.needs if n not in record}
        return frozenset(on)

    def help(self) -> str:
        """One line for a CLI's help: each switch, what it does, what it needs."""
        return "; ".join(f"{s.name}: {s.what}" + (f" (needs {', '.join(s.needs)})" if s.needs else "")
                         for s in self.declared)


NONE = Switches()


def switch_label(on: Iterable[str]) -> str:
    """A set of switches as the tools print it: names joined by '+', sorted ('' for none)."""
    return "+".join(sorted(on))
