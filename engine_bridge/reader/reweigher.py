"""The split reader's re-weighting: its window of per-source counters, fed by the lanes, and the
weights the next reads are cut with (the rules are pure, in `reweighting.py`; docs/reader.md
"Re-weighting").

The lanes call `started`, `moved` and `ended` for every attempt under their lock; the reader calls
`step` under the same lock when a read is submitted: once a window is over it is judged, and a
change of weights comes back to be announced as an event. A window counts only reads cut with the
weights in force (`epoch`: every change starts a new one, and the reader tags each read with the
epoch whose weights cut it, or -1): reads cut with the old weights, still queued or in a kernel
after a change, would judge the new weights by the old shares (the overshoot of an earlier version:
100:25:50, then 100:11:50, on a drive at half speed). A source moved below its plan that got no
work in the window is owed a *sample*: a copy of a piece of the next read, read at the back of its
queue into a private buffer, so a drive that recovers is seen to recover even when its floor share
rounds to no piece at all.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .attempts import MAIN, Attempt
from .reweighting import MIN_MULT, RECENT_REQUESTS, Decision, ReweighPolicy, Window, busy_rates, judge, pooled_rates, weights_for


class Reweigher:
    """Per-source windows and the current weights of each phase for one SplitReader.
    weights: phase -> the plan's weights; wmin/wmax: the engine's weight range."""

    def __init__(self, weights: dict[str, Sequence[int]], policy: ReweighPolicy, clock: Callable[[], int],
                 wmin: int = 1, wmax: int = 100):
        self.base = {ph: tuple(w) for ph, w in weights.items()}
        n = len(next(iter(self.base.values())))
        self.policy, self.clock, self.wmin, self.wmax = policy, clock, wmin, wmax
        self.current = dict(self.base)
        self.mult = (1.0,) * n
        self.streak = (0,) * n
        self.window = Window(n, clock())
        self.sampled = [False] * n
        self.changes = 0
        self.epoch = 0                  # weights changes so far: reads cut with the weights in force carry it
        self.judged: list = []          # (bytes, busy ns) per source of the windows judged since the last move
        self.carry = [(0.0, 0.0)] * n   # per source: (bytes, busy ns) of judged windows it was busy too little in

    # -- lanes, their lock held ----------------------------------------------------------------

    def started(self, att: Attempt) -> None:
        """A lane starts `att`: the window counts it, and its source busy, when its read was cut with
        the weights in force (samples and probes always are)."""
        att.t_start = self.clock()
        att.counted = att.epoch == self.epoch
        if att.counted:
            phase = att.piece.ticket.phase if att.kind == MAIN and att.piece is not None else ""
            self.window.queued(att.src, att.ln, att.t_start, phase)

    def moved(self, att: Attempt, new: int) -> None:
        """A started attempt fails over to source `new`."""
        if att.counted and att.epoch == self.epoch:
            now = self.clock()
            self.window.ended(att.src, 0, now)
            self.window.queued(new, 0, now)

    def ended(self, att: Attempt, s: int, delivered: bool) -> None:
        if att.counted and att.epoch == self.epoch:     # (a window of older weights is gone)
            att.counted = False
            self.window.ended(s, att.ln if delivered else 0, self.clock(), att.t_start)

    # -- the reader, the lanes' lock held --------------------------------------------------------

    def came_back(self, s: int, pace: float, healthy: Sequence[int]) -> dict | None:
        """Source `s` rejoins the split (`healthy`, it included) after the hedger took it out again
        before it had kept up for long since its last return: it comes back at `pace` of its weight
        (its pace then, over its weight's share of the others'), not all of it; the windows move it
        from there as for any drive. The change, for the event; None when that moves nothing."""
        m = max(MIN_MULT, self.mult[s] * pace)
        if m >= self.mult[s]:
            return None
        mult = tuple(m if i == s else x for i, x in enumerate(self.mult))
        why = (f"source {s} came back after it was taken out again soon after its last return: at {pace:.2f} of "
               f"its weight's share of the others' pace, its pace when taken out")
        return self._move(mult, healthy, self.clock(), s, why, {})

    def _move(self, mult: tuple[float, ...], healthy: Sequence[int], now: int, source: int, why: str,
              rates: dict) -> dict | None:
        """Cut the next reads with the weights of multipliers `mult`: the change, for the event (None
        when the engine's integer weights stay the same)."""
        new = {ph: weights_for(b, mult, healthy, self.policy.floor, self.wmin, self.wmax) for ph, b in self.base.items()}
        self.mult = mult
        if new == self.current:
            return None
        self.epoch += 1                                 # what is out now was cut with the old weights:
        self.window = Window(len(self.mult), now)       # the next window counts none of it
        self.carry = [(0.0, 0.0)] * len(self.mult)
        self.streak = (0,) * len(self.mult)
        self.judged = []
        change = {"source": source, "old": {ph: list(v) for ph, v in self.current.items()},
                  "new": {ph: list(v) for ph, v in new.items()}, "why": why,
                  "rates_mbs": {str(s): round(r * 1e3, 3) for s, r in sorted(rates.items())}, "t_ns": now}
        self.current = new
        self.changes += 1
        return change

    def weights(self, phase: str) -> tuple[int, ...]:
        return self.current[phase]

    def step(self, healthy: Sequence[int]) -> tuple[dict | None, list[int]]:
        """Judge the window if it is over: (the change, for the event, or None; sources owed a sample)."""
        now = self.clock()
        w = self.window
        change = None
        if w.ready(now, healthy, self.policy.window_ns):
            phase = w.phase()
            b, t = w.carried(self.carry)
            rates = busy_rates(b, t, healthy, self.policy.min_busy_ns)
            if w.loaded(healthy, now) >= self.policy.loaded:
                pending = [s for s in healthy if s not in rates and t[s] > 0]
                self.judged = (self.judged + [(list(w.bytes), list(w.busy))])[-self.policy.confirm:]
                d = judge(self.mult, self.base[phase], rates, self.streak, self.policy,
                          size=pooled_rates(self.judged, rates), pending=pending,
                          recent={s: (w.recent_rate(s), w.recent_rate(s, RECENT_REQUESTS // 2)) for s in rates})
                # a source busy too little for a rate carries this window's work into the next
                self.carry = [(b[s], t[s]) if s in pending else (0.0, 0.0) for s in range(len(b))]
            else:               # the drives idled: nothing to learn of their pace, nothing to gain
                d = Decision(None, (0,) * len(self.mult))
                self.carry = [(0.0, 0.0)] * len(self.mult)
            if not any(d.streak) or d.mult is not None:     # a move, or back in the band: a new streak
                self.judged = []                            # pools only its own windows
            self.streak = d.streak
            self.window = w.close(now)
            self.sampled = [False] * len(self.sampled)
            if d.mult is not None:
                change = self._move(d.mult, healthy, now, d.source, d.why, rates)
        owed = []
        if now - self.window.start >= self.policy.window_ns // 2:
            for s in healthy:
                if self.mult[s] < 1.0 and not self.sampled[s] and self.window.bytes[s] == 0 \
                        and self.window.outstanding[s] == 0:
                    self.sampled[s] = True
                    owed.append(s)
        return change, owed
