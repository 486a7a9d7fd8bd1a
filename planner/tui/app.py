"""The split tuner's Textual app. It renders a `TunerState` (text from `view`) and turns keys
into the state's pure transitions; the pricing and the solver live in the planner."""

from __future__ import annotations

from typing import Callable

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Footer, Header, Static

from core.cli import require_terminal
from core.errors import ReplicaTunerError

from . import state as st
from . import view

Saver = Callable[[st.TunerState], str]
Solver = Callable[[st.TunerState], st.Solution]
# Measures the weights (and switches) on screen for the phase on screen: bytes/s. It reads
# state.sources, state.problem, state.phase, state.weights() and state.mode. The split reader that
# can do it lives above the planner, so `engine-bridge tune` passes one in; `planner tune` has none.
Measurer = Callable[[st.TunerState], float]
NO_MEASURE = "measuring needs the split reader: open this tuner with `engine-bridge tune`"


class TrialDone(Message):
    """The worker's measured trial finished (bytes/s) or failed."""

    def __init__(self, phase: str, weights: tuple[int, ...], Bps: float | None, error: str = "",
                 mode: frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.phase, self.weights, self.Bps, self.error, self.mode = phase, weights, Bps, error, mode


class Solved(Message):
    """The worker's solve finished."""

    def __init__(self, solution: st.Solution | None, error: str = "") -> None:
        super().__init__()
        self.solution, self.error = solution, error


# Below this many columns the sources table drops its pieces and experts columns and takes short
# headers: at 80 columns the eleven columns cut every header to "so… we… sh…" and the cells with them.
WIDE = 100


class SourcesPanel(Static):
    """The phase's prediction per source, as a table with a bar of its share of the bytes; the
    columns fit the terminal (the less needed ones go first)."""

    def show(self, s: st.TunerState) -> None:
        wide = self.app.size.width >= WIDE
        t = Table(title=view.table_title(s), title_justify="left", expand=True, box=None, padding=(0, 1))
        cols = ((("", "left"), ("source", "left"), ("weight", "right"), ("share", "right"), ("bytes/layer", "right"),
                 ("pieces", "right"), ("experts", "right"), ("busy ms", "right"), ("last", "right"), ("bytes", "left"),
                 ("", "left")) if wide else
                (("", "left"), ("src", "left"), ("w", "right"), ("share", "right"), ("B/layer", "right"),
                 ("busy ms", "right"), ("last", "right"), ("bytes", "left"), ("", "left")))
        for col, just in cols:
            t.add_column(col, justify=just, no_wrap=col not in ("", "last"), overflow="fold")
        for r in view.source_rows(s):
            style = "bold reverse" if r.selected else ""
            middle = (r.nbytes, r.pieces, r.experts) if wide else (r.nbytes,)
            t.add_row("▶" if r.selected else " ", r.name, r.weight, r.share, *middle, r.busy_ms,
                      r.last, r.bar, Text(r.note, style="bold yellow"), style=style)
        self.update(t)


class TunerApp(App):
    """`planner tune`: nudge per-source weights per phase (and the engine's switches) and read the
    one pricing's prediction."""

    TITLE = "planner tune"
    CSS = """
    #tabs { height: 1; margin: 1 1 0 1; }
    #engine { height: auto; margin: 0 1; color: $text-muted; }
    #sources { margin: 1 1 0 1; }
    #summary { margin: 1 1 0 1; }
    #measured { margin: 1 1 0 1; height: auto; }
    #trials { margin: 1 1 0 1; height: auto; }
    #plan { margin: 1 1 0 1; color: $text-muted; }
    #message { margin: 0 1; color: $warning; }
    """
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "source"),
        Binding("down,j", "cursor(1)", "source", show=False),
        # the footer has one row: at 80 columns it lost `save` and `quit` behind eleven keys; the
        # steps of ten are in the help (`?`-less: README and docs/planner.md list every key)
        Binding("right,plus,equals_sign", "nudge(1)", "±1"),
        Binding("left,minus", "nudge(-1)", "-1", show=False),
        Binding("right_square_bracket,shift+right", "nudge(10)", "+10", show=False),
        Binding("left_square_bracket,shift+left", "nudge(-10)", "-10", show=False),
        Binding("p", "phase", "phase"),
        Binding("o", "switches", "switches"),
        Binding("r", "reset", "reset"),
        Binding("m", "measure", "measure"),
        Binding("s", "save", "save"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, state: st.TunerState, save: Saver | None = None, solve: Solver | None = None,
                 subtitle: str = "", measure: Measurer | None = None) -> None:
        super().__init__()
        self.state = state
        self._save, self._solve, self._measure = save, solve, measure
        self.sub_title = subtitle

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():          # a tall body scrolls; the footer (and `q quit`) always shows
            yield Static(id="tabs")
            yield Static(id="engine")
            yield SourcesPanel(id="sources")
            yield Static(id="summary")
            yield Static(id="measured")
            yield Static(id="trials")
            yield Static(id="plan")
            yield Static(id="message")
        yield Footer()

    def on_mount(self) -> None:
        self.render_state()
        if self.state.solved is None and self._solve is not None:
            solve, s = self._solve, self.state
            self.run_worker(lambda: self._solve_in_thread(solve, s), thread=True, exclusive=True, name="solve")

    def _solve_in_thread(self, solve: Solver, s: st.TunerState) -> None:
        try:
            self.post_message(Solved(solve(s)))
        except Exception as e:   # shown on screen; the worker must not take the app down
            self.post_message(Solved(None, f"solve failed: {e}"))

    def on_solved(self, msg: Solved) -> None:
        self.apply(st.with_solution(self.state, msg.solution) if msg.solution is not None
                   else st.with_message(self.state, msg.error))

    def on_resize(self) -> None:
        if self.query(SourcesPanel):       # the sources table's columns fit the width
            self.render_state()

    def apply(self, new: st.TunerState) -> None:
        self.state = new
        self.render_state()

    def render_state(self) -> None:
        s = self.state
        tabs = Text()
        for label, on in view.phase_tabs(s):
            tabs.append(f" {label} ", style="bold reverse" if on else "dim")
            tabs.append("  ")
        tabs.append("(p: phase)", style="dim")
        self.query_one("#tabs", Static).update(tabs)
        self.query_one("#engine", Static).update("\n".join(view.engine_lines(s)))
        self.query_one(SourcesPanel).show(s)
        self.query_one("#summary", Static).update("\n".join(view.summary(s)))
        measured = view.measured_lines(s)
        self.query_one("#measured", Static).update("\n".join(measured))
        self.query_one("#measured", Static).display = bool(measured)
        trials = view.trial_lines(s)
        self.query_one("#trials", Static).update("\n".join(trials))
        self.query_one("#trials", Static).display = bool(trials)
        self.query_one("#plan", Static).update(view.plan_line(s))
        self.query_one("#message", Static).update(s.message)

    def action_cursor(self, delta: int) -> None:
        self.apply(st.move_cursor(self.state, delta))

    def action_nudge(self, delta: int) -> None:
        self.apply(st.nudge(self.state, self.state.cursor, delta))

    def action_phase(self) -> None:
        self.apply(st.switch_phase(self.state))

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """The switches key only for an engine with switches that matter on this model."""
        if action == "switches":
            return len(self.state.modes) > 1
        return True

    def action_switches(self) -> None:
        self.apply(st.next_mode(self.state))

    def action_reset(self) -> None:
        self.apply(st.reset(self.state))

    def action_measure(self) -> None:
        if self._measure is None:
            self.apply(st.with_message(self.state, NO_MEASURE))
            return
        if self.state.measuring:
            self.apply(st.with_message(self.state, "a trial is still running"))
            return
        measure, s = self._measure, st.start_trial(self.state)
        self.apply(s)
        self.run_worker(lambda: self._measure_in_thread(measure, s), thread=True, name="measure")

    def _measure_in_thread(self, measure: Measurer, s: st.TunerState) -> None:
        try:
            self.post_message(TrialDone(s.phase, s.weights(), float(measure(s)), mode=s.mode))
        except Exception as e:   # shown on screen; the worker must not take the app down
            self.post_message(TrialDone(s.phase, s.weights(), None, f"measuring failed: {e}", s.mode))

    def on_trial_done(self, msg: TrialDone) -> None:
        self.apply(st.with_trial(self.state, msg.phase, msg.weights, msg.Bps, msg.error, msg.mode))

    def action_save(self) -> None:
        if self._save is None:
            self.apply(st.with_message(self.state, "saving is off (no rig)"))
            return
        try:
            path = self._save(self.state)
        except (ReplicaTunerError, OSError) as e:
            self.apply(st.with_message(self.state, f"save failed: {e}"))
            return
        self.apply(st.with_message(self.state, f"saved {path}"))


def run_tuner(rig_root: str, bench: str | None = None, plan: str | None = None, calibrate: bool = True,
              measure: Measurer | None = None, engine: str | None = None) -> None:
    """Load the rig (errors surface before the screen opens), then run the app. `measure`: what
    the `m` key runs (None: the key says where measuring is); `engine`: the engine to tune when
    there is no plan for it (default: the plan's)."""
    from .load import load_tuner, save_tuned, solve_weights

    state = load_tuner(rig_root, bench, plan, calibrate, engine)
    require_terminal("the split tuner", "make a plan with `planner solve` or `engine-bridge autotune`")
    TunerApp(state, save=lambda s: save_tuned(rig_root, s), solve=solve_weights, subtitle=rig_root,
             measure=measure).run()
