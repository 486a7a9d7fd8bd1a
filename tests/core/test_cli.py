"""The CLI boundary every app shares: consoles that keep piped lines whole, and usage errors as
one line with exit 2, whatever the parser found wrong."""

import io
import os
import subprocess
import sys

import pytest
import typer
from rich.table import Table
from typer.testing import CliRunner

from core.cli import PIPE_WIDTH, WholeLineConsole, make_app, out
from engine_bridge.cli import app as engine_bridge_app
from fleet.cli import app as fleet_app
from iobench.cli import app as iobench_app
from planner.cli import app as planner_app
from replicas.cli import app as replicas_app

LONG = "/mnt/" + "/".join(f"replica-drive-{i:02d}" for i in range(12)) + "/DeepSeek-V4.1-Flash-Q4_K_M.gguf"


def tiny_app():
    app = make_app("tiny", "A small app built like the real ones.")

    @app.command()
    def where(count: int = typer.Option(..., "--count", help="How many."),
              name: str = typer.Argument(..., metavar="NAME")):
        """Print a long path as a line and in a table."""
        out.print(f"path {LONG} x{count} {name}")
        t = Table(title="members")
        for col in ("name", "path"):
            t.add_column(col)
        t.add_row(name, LONG)
        out.print(t)

    @app.command()
    def other():
        """A second command, so the app keeps its command names."""

    return app


def test_piped_output_keeps_long_paths_whole_on_one_line():
    r = CliRunner().invoke(tiny_app(), ["where", "--count", "3", "green"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert f"path {LONG} x3 green" in lines                    # not wrapped at 80 columns
    assert any(LONG in line and "green" in line for line in lines)   # the table's row: whole, not "/mnt/repli…"
    assert "…" not in r.stdout
    assert max(len(x) for x in lines) < len(LONG) + 40           # the table keeps its natural width


def test_a_real_pipe_gets_whole_lines_too():
    code = ("from core.cli import out\n"
            "from rich.table import Table\n"
            f"out.print('line ' + {LONG!r})\n"
            "t = Table()\nt.add_column('path')\n"
            f"t.add_row({LONG!r})\nout.print(t)\n")
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, check=True,
                       env={"PATH": "/usr/bin:/bin", "COLUMNS": "80", "PYTHONPATH": ":".join(sys.path)})
    assert f"line {LONG}" in p.stdout.splitlines()
    assert any(LONG in line for line in p.stdout.splitlines()[1:]) and "…" not in p.stdout


def test_a_terminal_still_gets_lines_fitted_to_its_width():
    buf = io.StringIO()
    console = WholeLineConsole(file=buf, force_terminal=True, width=40, color_system=None)
    console.print(f"path {LONG}")
    assert console.width == 40 and not console.soft_wrap
    assert all(len(line) <= 40 for line in buf.getvalue().splitlines()) and len(buf.getvalue().splitlines()) > 1


def test_a_console_that_is_not_a_terminal_is_as_wide_as_no_line():
    console = WholeLineConsole(file=io.StringIO())
    assert console.width == PIPE_WIDTH and console.soft_wrap


@pytest.mark.parametrize("args, message", [
    (["where", "green"], "tiny: error: missing option '--count' (see 'tiny where -h')"),
    (["where", "--count", "many", "green"], "tiny: error: invalid value for '--count': "),
    (["where", "--count", "1"], "tiny: error: missing argument 'NAME' (see 'tiny where -h')"),
    (["where", "--count"], "tiny: error: option '--count' requires an argument (see 'tiny where -h')"),
    (["where", "--color", "green"], "tiny: error: no such option: --color (see 'tiny where -h')"),
    (["--colour", "where"], "tiny: error: no such option: --colour (see 'tiny -h')"),
    (["nowhere"], "tiny: error: no such command 'nowhere'"),
])
def test_usage_errors_are_one_line_and_exit_2(args, message):
    r = CliRunner().invoke(tiny_app(), args, prog_name="tiny")
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(message), r.stderr
    assert r.stderr.endswith("')\n") and r.stdout == ""
    assert "╭" not in r.stderr and "Usage:" not in r.stderr


def test_a_bare_app_name_still_shows_the_help():
    r = CliRunner().invoke(tiny_app(), [], prog_name="tiny")
    assert r.exit_code == 2 and "Usage: tiny" in r.output and "where" in r.output and "tiny: error" not in r.output


@pytest.mark.parametrize("app, prog, args, message", [
    (iobench_app, "iobench", ["run", "--seconds", "abc"], "invalid value for '--seconds'"),
    (planner_app, "planner", ["split"], "missing option '--weights'"),
    (engine_bridge_app, "engine-bridge", ["bench"], "missing option '--arm'"),
    (replicas_app, "replicas", ["--nope"], "no such option: --nope"),
])
def test_every_app_reports_usage_errors_the_same_way(app, prog, args, message):
    r = CliRunner().invoke(app, args, prog_name=prog)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: {message}"), r.stderr


@pytest.mark.parametrize("app", [iobench_app, planner_app, engine_bridge_app, replicas_app])
def test_every_app_says_its_units_once_in_its_help(app):
    r = CliRunner().invoke(app, ["-h"])
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    assert text.count("binary") == 1 and text.count("decimal") == 1
    assert "GiB" in text and "GB/s" in text


def _commands(app, prog):
    """(argv to reach it, usage line) for every command of an app, sub-groups included."""
    group = typer.main.get_command(app)
    stack = [((), group)]
    while stack:
        path, cmd = stack.pop()
        for name, sub in getattr(cmd, "commands", {}).items():
            stack.append(((*path, name), sub))
        if path:
            yield [*path], cmd


@pytest.mark.parametrize("app, prog", [(iobench_app, "iobench"), (planner_app, "planner"),
                                       (engine_bridge_app, "engine-bridge"), (replicas_app, "replicas")])
def test_usage_lines_name_arguments_plainly(app, prog):
    for path, cmd in _commands(app, prog):
        r = CliRunner().invoke(app, [*path, "-h"], prog_name=prog)
        assert r.exit_code == 0, (path, r.output)
        (usage,) = [line.strip() for line in r.stdout.splitlines() if line.strip().startswith("Usage: ")]
        assert usage.startswith(f"Usage: {prog} {' '.join(path)} ")
        assert "{" not in usage and "[[" not in usage and "]...]" not in usage, usage


@pytest.mark.parametrize("app, prog", [(iobench_app, "iobench"), (planner_app, "planner"),
                                       (engine_bridge_app, "engine-bridge"), (replicas_app, "replicas"),
                                       (fleet_app, "fleet")])
def test_help_names_values_not_python_types_and_reads_whole_at_80_columns(app, prog, monkeypatch):
    """Every command's -h at 80 columns: no flag promises a value (`--json <bool>`), no Python type
    names (<str>, <int>, <list[str]>), no text cut short with '…', and prose wrapped by the screen,
    not by the docstring's own line breaks (no line of a paragraph ends far short of the width
    while the next one starts with a word that would have fitted)."""
    import rich.console
    import typer.rich_utils

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 80)
    monkeypatch.setattr(rich.console.Console, "is_terminal", property(lambda self: False))
    for path, _ in [([], None), *_commands(app, prog)]:
        r = CliRunner().invoke(app, [*path, "-h"], prog_name=prog, env={"COLUMNS": "80"})
        assert r.exit_code == 0, (path, r.output)
        for bad in ("<bool>", "<str>", "<int>", "<float>", "list[", "…"):
            assert bad not in r.stdout, (path, bad, r.stdout)
        lines = r.stdout.splitlines()
        for a, b in zip(lines, lines[1:]):
            if a.startswith(" ") and b.startswith(" ") and not a.strip().startswith(("│", "╭", "╰")) and a.strip() and b.strip():
                first = b.split()[0]
                assert len(a.rstrip()) + 1 + len(first) > 79, (path, a, b)      # `first` would have fitted (1 column of padding)


def test_a_value_after_a_flag_says_flags_take_none():
    r = CliRunner().invoke(replicas_app, ["status", "--json", "true"], prog_name="replicas")
    assert r.exit_code == 2 and "takes no value" in r.stderr


def test_a_progress_rate_is_what_was_moved_over_the_time_taken():
    """A copy reports durable bytes in batches: two landing 0.1 s apart read as GB/s to Rich's
    speed (steps over the span between reports) whatever the drive's pace. The rate column is the
    bytes moved since the first report over the time until now, once 3 s have passed; a report
    stepping back (a file started over) restarts it."""
    from rich.progress import Progress

    from core.ratecolumn import AverageRateColumn

    MiB = 1 << 20
    now = {"t": 10.0}
    column = AverageRateColumn()
    bars = Progress(column, get_time=lambda: now["t"], disable=True)
    task_id = bars.add_task("copy", total=4096 * MiB)
    task = bars.tasks[0]
    for t, done in ((10.0, 256 * MiB), (10.1, 512 * MiB)):       # two fdatasync batches close together
        now["t"] = t
        bars.update(task_id, completed=done)
        assert column.render(task).plain == ""                   # under 3 s: no rate yet
    now["t"] = 13.2                                              # the next batch is still being paced
    assert task.speed > 2e9                                      # Rich: 256 MiB in 0.1 s
    assert column.render(task).plain == "84 MB/s"                # 256 MiB moved in 3.2 s
    bars.update(task_id, completed=128 * MiB)                    # started over
    assert column.render(task).plain == ""
    now["t"] = 16.2
    bars.update(task_id, completed=228 * MiB)
    assert column.render(task).plain == "35 MB/s"                # 100 MiB in the 3 s since
    now["t"] = 19.2
    bars.update(task_id, completed=4096 * MiB)                   # done: the rate is the one at the end
    done = column.render(task).plain
    now["t"] = 60.0
    assert column.render(task).plain == done == "693 MB/s"       # (4096 - 128) MiB in 6 s, not decaying after


def test_a_ctrl_c_no_command_caught_still_says_how_to_go_on():
    """A Ctrl-C before a command installs its own handler (or a second one that aborts at once)
    reached the boundary as a bare 'interrupted'; it says, as exit 130 promises, to run it again."""
    app = make_app("tiny", "A small app.")

    @app.command()
    def stop():
        """Interrupted at once."""
        raise KeyboardInterrupt

    @app.command()
    def other():
        """A second command."""

    r = CliRunner().invoke(app, ["stop"], prog_name="tiny")
    assert r.exit_code == 130
    assert r.stderr.strip() == "tiny: error: interrupted; nothing half-done was kept: run the same command again to start over"


def _python_with_ctrl_c(code: str) -> list[str]:
    """argv running `code` in a Python whose Ctrl-C has its default disposition whatever this
    process's is: a child inherits an ignored SIGINT (a suite started as a background job by a
    shell without job control runs with SIGINT ignored), and Python then installs no handler of
    its own."""
    return [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
            "os.execv(sys.executable, [sys.executable, '-c', sys.argv[1]])", code]


def test_a_ctrl_c_while_a_tool_is_still_starting_is_the_one_line():
    """Until a command runs, a Ctrl-C (during imports or parsing) printed a traceback or nothing
    (exit 130 either way); the guard writes the one line. The signal is sent by the process to
    itself, so nothing here depends on timing."""
    code = ("import os, signal, time; from core.interrupt import guard; guard('replicas'); "
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(30)")
    r = subprocess.run(_python_with_ctrl_c(code), capture_output=True, text=True, timeout=60)
    assert r.returncode == 130 and r.stdout == ""
    assert r.stderr == "replicas: error: interrupted; nothing half-done was kept: run the same command again to start over\n"


def test_importing_a_package_as_a_library_leaves_ctrl_c_alone():
    code = ("import signal, replicas, iobench, planner, engine_bridge, fleet; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    r = subprocess.run(_python_with_ctrl_c(code), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


@pytest.mark.parametrize("app, prog, command", [(replicas_app, "replicas", ["status"]), (iobench_app, "iobench", ["show"]),
                                                (planner_app, "planner", ["show"]),
                                                (engine_bridge_app, "engine-bridge", ["profiles"])])
@pytest.mark.parametrize("how", ["option", "environment", "through a file"])
def test_a_rig_path_of_the_wrong_kind_is_one_line_in_every_tool(tmp_path, app, prog, command, how):
    """--rig (or $REPLICA_TUNER_RIG) at a file was a NotADirectoryError traceback in all four tools;
    it is refused while parsing, naming where the path came from (exit 2)."""
    afile = tmp_path / "notes.txt"
    afile.write_text("not a rig")
    path = str(afile / "rig") if how == "through a file" else str(afile)
    args, env = ([*command], {"REPLICA_TUNER_RIG": path}) if how == "environment" else ([*command, "--rig", path], {})
    r = CliRunner().invoke(app, args, prog_name=prog, env=env)
    assert r.exit_code == 2, r.output
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    named = "$REPLICA_TUNER_RIG" if how == "environment" else "--rig"
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: {named} {path}: ") and "not a folder" in lines[0]
    assert "Traceback" not in r.output


def test_the_one_ctrl_c_policy_first_cancels_second_aborts_then_restores_the_handler():
    """core.interrupt.cancel_on_interrupt, which every long command runs under: the first Ctrl-C
    sets the cancel flag and says what stopping means, the second raises KeyboardInterrupt (the
    boundary's exit 130), and the handler before it is back afterwards. Real signals, sent by the
    process to itself, so nothing depends on timing."""
    code = ("import os, signal, time\n"
            "from core.interrupt import cancel_on_interrupt\n"
            "said, before = [], signal.getsignal(signal.SIGINT)\n"
            "try:\n"
            "    with cancel_on_interrupt(said.append, 'stopping after this arm') as cancel:\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        print(cancel.is_set(), said)\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "        time.sleep(30)\n"
            "except KeyboardInterrupt:\n"
            "    print('aborted')\n"
            "print(signal.getsignal(signal.SIGINT) is before)\n")
    r = subprocess.run(_python_with_ctrl_c(code), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True ['stopping after this arm']", "aborted", "True"]


@pytest.mark.parametrize("err, code, words", [
    (40, 3, "symbolic link loop"),        # ELOOP: a path that cannot be read
    (36, 2, "name too long"),             # ENAMETOOLONG
    (5, 3, "input/output error"),         # EIO
    (28, 4, "no space left"),             # ENOSPC
])
def test_an_os_error_nothing_caught_is_one_line_with_readmes_code(err, code, words):
    app = make_app("tiny", "A small app.")

    @app.command()
    def fail():
        """Fails the way a drive or a path can."""
        raise OSError(err, "strerror", "/some/path")

    @app.command()
    def other():
        """A second command."""

    r = CliRunner().invoke(app, ["fail"], prog_name="tiny")
    assert r.exit_code == code
    assert r.stderr.startswith("tiny: error: /some/path: ") and words in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_reader_that_left_is_a_quiet_0():
    """`replicas status | head -1`: rich's console answered a closed pipe with SystemExit(1) from
    inside print; the boundary's README rule is a quiet 0."""
    code = ("import sys, os\n"
            "from core.cli import make_app, out\n"
            "app = make_app('tiny', 'x')\n"
            "@app.command()\n"
            "def table():\n"
            "    for i in range(20000): out.print(f'row {i} ' + 'x' * 60)\n"
            "@app.command()\n"
            "def other(): pass\n"
            "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
            "app(['table'], prog_name='tiny')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_a_number_option_that_is_not_finite_is_one_line_before_the_command_runs(value):
    """NaN passes every `x <= 0` range check and int(inf * 1e9) is a traceback: every float option
    of every command is checked once, at the boundary (core.cli.PlainUsageCommand)."""
    app = make_app("tiny", "A small app.")
    ran = []

    @app.command()
    def wait(seconds: float = typer.Option(1.0, "--seconds"), many: list[float] = typer.Option([], "--at")):
        """Takes seconds."""
        ran.append(seconds)

    @app.command()
    def other():
        """A second command."""

    @app.command()
    def share(part: float = typer.Option(0.5, "--part", min=0.0, max=1.0)):
        """A bounded option: its range is checked by the parser, before the finite check."""
        ran.append(part)

    for args in (["wait", "--seconds", value], ["wait", "--at", "1", "--at", value], ["share", "--part", value]):
        r = CliRunner().invoke(app, args, prog_name="tiny")
        assert r.exit_code == 2 and "give a finite number" in r.stderr and len(r.stderr.splitlines()) == 1, r.output
    assert ran == []
    assert CliRunner().invoke(app, ["wait", "--seconds", "-0"]).exit_code == 0      # finite: the command's own rules


@pytest.mark.parametrize("how, words", [("loop", "is a symbolic link loop"), ("dangling", "is a link to nowhere (gone)"),
                                        ("fifo", "is a fifo"), ("through a loop", "runs through")])
def test_a_rig_path_says_what_it_is(tmp_path, how, words):
    """--rig at a link loop or a fifo said 'is a file'."""
    if how in ("loop", "through a loop"):
        os.symlink("rigloop", tmp_path / "rigloop")
    elif how == "dangling":
        os.symlink("gone", tmp_path / "rigloop")
    else:
        os.mkfifo(tmp_path / "rigloop")
    path = str(tmp_path / "rigloop") + ("/sub" if how == "through a loop" else "")
    r = CliRunner().invoke(replicas_app, ["status", "--rig", path], prog_name="replicas")
    assert r.exit_code == 2 and words in r.stderr and "is a file" not in r.stderr, r.output


def test_a_value_of_the_wrong_type_is_said_in_plain_words():
    r = CliRunner().invoke(planner_app, ["solve", "--top", "abc"], prog_name="planner")
    assert r.exit_code == 2 and "'--top': give a whole number" in r.stderr and "Input should" not in r.stderr


@pytest.mark.parametrize("code", [1, 2, 3, 4, 130])
def test_a_steps_exit_code_carried_on_keeps_readmes_meaning(code):
    """tune-rig raises a failed copy's worst destination as its own error: a write that failed (4)
    stays 4, not usage."""
    from core.errors import error_for

    e = error_for(code, "copy to d: failed")
    assert e.exit_code == code and str(e) == "copy to d: failed"


def test_plain_values_are_taken_as_parsed_and_the_rest_as_typer_converts_them():
    """`PlainValue`: a plain int, float, str or list of str arrives converted, without Typer's
    pydantic adapter; a value that is not plainly one (a word for a number, a value out of a
    range) still gets Typer's check and this project's words for it."""
    app = make_app("tiny", "A small app built like the real ones.")
    got = {}

    @app.command()
    def take(count: int = typer.Option(1, "--count"), share: float = typer.Option(0.5, "--share"),
             pct: float = typer.Option(50.0, "--pct", min=0.0, max=100.0), names: list[str] = typer.Argument(None)):
        """Keep what was given."""
        got.update(count=count, share=share, pct=pct, names=names)

    @app.command()
    def other():
        """A second command, so the app keeps its command names."""

    r = CliRunner().invoke(app, ["take", "--count", "-7", "--share", "2.5e-1", "--pct", "12", "a", "b"], prog_name="tiny")
    assert r.exit_code == 0, r.output
    assert got == {"count": -7, "share": 0.25, "pct": 12.0, "names": ["a", "b"]}
    assert type(got["count"]) is int and type(got["share"]) is float
    r = CliRunner().invoke(app, ["take"], prog_name="tiny")
    assert r.exit_code == 0 and got == {"count": 1, "share": 0.5, "pct": 50.0, "names": None}, r.output   # as Typer gives it
    for args, words in ((["--count", "seven"], "'--count': give a whole number"),
                        (["--share", "half"], "'--share': give a number"),
                        (["--pct", "200"], "'--pct': give a finite number no more than 100")):
        r = CliRunner().invoke(app, ["take", *args], prog_name="tiny")
        assert r.exit_code == 2 and words in r.stderr, (args, r.stderr)


def test_a_command_with_plain_values_does_not_import_pydantic(tmp_path):
    """Typer 0.29 would import pydantic (a tenth of a second of start-up) to convert values any
    parser already has; `replicas verify` of a rig and `replicas status` never need it."""
    code = ("import sys\n"
            "from typer.testing import CliRunner\n"
            "from replicas.cli import app\n"
            f"r = CliRunner().invoke(app, ['status', '--rig', {str(tmp_path / 'rig')!r}], prog_name='replicas')\n"
            "print(r.exit_code, 'pydantic' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[1] == "False", p.stdout
