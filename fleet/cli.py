"""`fleet`: the same job on every node of a Ray cluster, one report (docs/fleet.md)."""

from __future__ import annotations

from typing import Optional

import typer

from core.cli import JsonOption, QuietOption, RigOption, err, make_app, out, print_result, run
from core.errors import EXIT_MISMATCH, EXIT_MISSING
from core.rig import load_rig, rig_dir

from iobench.schedule import parse_lanes, parse_presets

from .constants import DEFAULT_TIMEOUT_S, FAILED, MISMATCH, OK
from .job import BenchSettings
from .report import render_table
from .asker import fleet_run, latest_report, load_report

app = make_app("fleet", "Verify, measure, solve and export on every node of a Ray cluster; one report for the fleet.")


def exit_code(report) -> int:
    """1 when a node has a bad replica or a failed step, else 3 when one is missing, lost, timed out
    or down, else 0."""
    states = {n.status for n in report.nodes}
    if states & {MISMATCH, FAILED}:
        return EXIT_MISMATCH
    return EXIT_MISSING if states - {OK} else 0


@app.command("run")
def run_cmd(fleet_file: str = typer.Argument(..., metavar="FLEET_FILE", help="The fleet file: each node and its rig folder."),
            rig: Optional[str] = RigOption,
            address: Optional[str] = typer.Option(None, "--address", metavar="HOST:PORT",
                                                  help="The Ray cluster (default: the one `ray start` runs here, 'auto')."),
            timeout: float = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", metavar="S",
                                          help="Seconds a node may take before it is reported as hanging and cancelled."),
            full: bool = typer.Option(False, "--full",
                                      help="Re-read every replica (verify --full); default: quick (live stamps are trusted)."),
            measure: bool = typer.Option(False, "--measure",
                                         help="Measure every node's drives again (default: only where its rig has "
                                              "no result for them)."),
            seconds: float = typer.Option(BenchSettings().seconds, "--bench-seconds", metavar="S",
                                          help="Seconds per measured window when a node measures its drives."),
            presets: str = typer.Option(",".join(BenchSettings().presets), "--bench-presets", metavar="P,P",
                                        help="iobench presets a node measures (a model too small for prefill's 32 MiB "
                                             "reads: seq,decode)."),
            lanes: str = typer.Option(",".join(map(str, BenchSettings().lanes)), "--bench-lanes", metavar="N,N",
                                      help="Lane counts a node measures each preset at."),
            cache_experts: Optional[int] = typer.Option(None, "--cache-experts", min=0,
                                                        help="Expert-cache size written into every profile."),
            force: bool = typer.Option(False, "--force",
                                       help="Redo every node's job, even where nothing changed since the last run."),
            quiet: bool = QuietOption,
            json_out: bool = JsonOption):
    """Run each node's job on its node: verify its replicas against the fleet's manifest (and the
    model's upstream digests when the rig has rig/upstream.json), measure its drives, solve its plan
    and export its profile. Writes rig/fleet/<UTC>.json and .txt here. A node that is down, lost,
    failed or hangs is reported, never fatal to the others; a rerun redoes only nodes whose model,
    rig or drives changed, or that did not finish.
    Exit 0 every node ok, 1 a bad replica or a failed step, 3 a node missing, lost, timed out or down."""

    def hear(res):
        if not quiet:
            err.print(f"{res.node}: {res.status}{' (reused)' if res.reused else ''}"
                      + (f" in {res.seconds:.1f} s" if res.seconds and not res.reused else ""), markup=False)

    report, path = fleet_run(fleet_file, rig_dir(rig), address=address, timeout_s=timeout,
                             verify="full" if full else "quick", measure="always" if measure else "auto",
                             bench=BenchSettings(parse_presets(presets, "--bench-presets"),
                                                 parse_lanes(lanes, "--bench-lanes"), seconds),
                             cache_experts=cache_experts, force=force, on_result=hear)
    if json_out:
        print_result(report)
    else:
        out.print(render_table(report), markup=False, highlight=False, soft_wrap=True, end="")
    if not quiet:
        err.print(f"fleet: wrote {path}", markup=False)
    code = exit_code(report)
    if code:
        raise typer.Exit(code)


@app.command()
def show(report: Optional[str] = typer.Argument(None, metavar="REPORT", help="A fleet report (default: newest in rig/fleet)."),
         rig: Optional[str] = RigOption, json_out: bool = JsonOption):
    """The fleet table of a report."""
    path = report or latest_report(load_rig(rig_dir(rig), must_exist=False))
    r = load_report(path)
    if json_out:
        print_result(r)
    else:
        out.print(render_table(r), markup=False, highlight=False, soft_wrap=True, end="")


def main() -> None:
    run(app, "fleet")


if __name__ == "__main__":
    main()
