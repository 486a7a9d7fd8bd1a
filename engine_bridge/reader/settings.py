"""The split reader's settings as one value (pure: no disk, no threads, no clock).

What the reader does beyond the engine's reads — hedging, re-weighting, balancing — and how many
lanes it runs per source travel together in a `ReaderSettings`, built and checked once
(`check_settings`), recorded whole in a run's result (`to_dict`). The bare reader's defaults are
the engine's reads exactly (everything off); the embedded engine's are `EMBEDDED` (everything on;
docs/reader.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .balancing import BalancePolicy, check_balance
from .hedging import HedgePolicy, check_policy
from .reweighting import ReweighPolicy, check_reweigh

LANES = 8          # reader threads per source


@dataclass(frozen=True)
class ReaderSettings:
    """lanes: reader threads per source. hedge: re-issue a late piece on another replica and take
    a drive that keeps being late out of the split until probes find it on time again; reweigh:
    move weight between the drives as their delivered rates change; balance: queue pieces as
    chunks and let an idle drive take a slower one's queued chunks. Each with its knobs."""

    lanes: int = LANES
    hedge: bool = False
    hedge_policy: HedgePolicy = field(default_factory=HedgePolicy)
    reweigh: bool = False
    reweigh_policy: ReweighPolicy = field(default_factory=ReweighPolicy)
    balance: bool = False
    balance_policy: BalancePolicy = field(default_factory=BalancePolicy)

    def to_dict(self) -> dict:
        """What a run's result records beside its `lanes`: each switch, and its knobs when it is on."""
        return {"hedge": self.hedge, "hedge_policy": self.hedge_policy.to_dict() if self.hedge else None,
                "reweigh": self.reweigh, "reweigh_policy": self.reweigh_policy.to_dict() if self.reweigh else None,
                "balance": self.balance, "balance_policy": self.balance_policy.to_dict() if self.balance else None}

    def but(self, **changes) -> ReaderSettings:
        """These settings with some fields changed (checked)."""
        return check_settings(replace(self, **changes))


EMBEDDED = ReaderSettings(hedge=True, reweigh=True, balance=True)    # the embedded engine's (run, replay)
OFF = {"hedge": False, "hedge_policy": None, "reweigh": False, "reweigh_policy": None, "balance": False,
       "balance_policy": None}          # what a result records of a run without a split reader of ours


def check_settings(s: ReaderSettings) -> ReaderSettings:
    """The settings, or ValueError naming the knob that makes no sense."""
    if isinstance(s.lanes, bool) or not isinstance(s.lanes, int) or s.lanes < 1:
        raise ValueError(f"lanes must be an integer >= 1, got {s.lanes!r}")
    check_policy(s.hedge_policy)
    check_reweigh(s.reweigh_policy)
    check_balance(s.balance_policy)
    return s
