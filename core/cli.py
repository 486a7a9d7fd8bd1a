"""What every console script shares: the error boundary, --debug, consoles, the --rig option.

Errors from the library arrive as `ReplicaTunerError`s; here, and only here, they become one
line on stderr and the documented exit code. `--debug` (or REPLICA_TUNER_DEBUG=1) shows the
traceback instead. Usage errors Typer finds while parsing (a missing option, a value of the wrong
type, an unknown command) take the same one-line form, with exit 2.

The consoles fit a terminal; anything else (a pipe, a log file) gets whole lines: no wrapping at
80 columns and no "repli…" in a table.
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import re
import signal
import sys
import threading
import traceback
from typing import List, Optional

import typer
from rich.console import Console, ConsoleDimensions
from typer._click import core as click_core
from typer._click.globals import get_current_context
from typer._click import exceptions as click_exceptions  # Typer >= 0.29 vendors click (pyproject pins it)
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from .constants import DEBUG_ENV, RIG_ENV
from .errors import EXIT_INTERRUPTED, EXIT_MISSING, EXIT_USAGE, EXIT_WRITE, ReplicaTunerError, UsageError
from .results import ErrorResult, Result, envelope
from .interrupt import INTERRUPTED, guard, guarded
from .rig import rig_dir
from .units import finite_or_none

# `--json true`: a value after a flag, which Click reports as an extra argument.
BOOL_WORD = re.compile(r"\((?:[^)]* )?(?:true|false|yes|no|on|off|1|0)(?: [^)]*)?\)", re.IGNORECASE)

# The type parser's messages, in the words every other message of this project uses.
PARSE_WORDS = (("Input should be a valid integer, unable to parse string as an integer", "give a whole number"),
               ("Input should be a valid number, unable to parse string as a number", "give a number"),
               ("Input should be a valid integer", "give a whole number"),
               ("Input should be a valid number", "give a number"))
# A range's bound (a NaN fails it too, so the words name a finite number).
RANGE_WORDS = ((re.compile(r"Input should be less than or equal to (\S+)"), r"give a finite number no more than \1"),
               (re.compile(r"Input should be greater than or equal to (\S+)"), r"give a finite number no less than \1"),
               (re.compile(r"Input should be less than (\S+)"), r"give a finite number below \1"),
               (re.compile(r"Input should be greater than (\S+)"), r"give a finite number above \1"))

# Width of a console that is not a terminal: wider than any line we print (a path is at most
# 4096 bytes on Linux), so nothing is wrapped or cut, while tables still take only their natural
# width (Rich tables do not expand to the console's width unless asked).
PIPE_WIDTH = 1 << 14


class WholeLineConsole(Console):
    """A Rich console that fits a terminal and never wraps or cuts output going anywhere else.

    Asked at every print, not once at start: the same module-level console writes to a terminal,
    to a pipe, or to a test's captured stream (sys.stdout is looked up when printing)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size) -> None:
        Console.size.fset(self, new_size)

    @property
    def soft_wrap(self) -> bool:
        # Soft wrapping (Rich: no word wrap, overflow "ignore", no crop) whenever the reader is
        # not a terminal, so a long line stays one line in a log.
        return self._soft_wrap or not self.is_terminal

    @soft_wrap.setter
    def soft_wrap(self, value: bool) -> None:
        self._soft_wrap = value

    def on_broken_pipe(self) -> None:
        """The reader left (`| head -1`): README's quiet 0. Rich's own answer is SystemExit(1) from
        inside print; here the stream goes to /dev/null (so the interpreter's last flush is quiet)
        and BrokenPipeError reaches the boundary, which exits 0."""
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self.file.fileno())
        except (OSError, ValueError):
            pass                                 # a stream with no descriptor (a test's capture)
        finally:
            os.close(devnull)
        raise BrokenPipeError(errno.EPIPE, "the reader closed the pipe")


# No emoji codes: weights print as "27:100:43", which Rich would otherwise turn into "27💯43".
out = WholeLineConsole(emoji=False)                     # data and tables: stdout
err = WholeLineConsole(stderr=True, emoji=False)        # progress and messages: stderr


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def reflow(text: Optional[str]) -> Optional[str]:
    """A docstring as help: each paragraph one line, which the help screen then wraps to the
    terminal's width (Typer keeps a docstring's hard line breaks, so help wrapped at 80 columns
    came out ragged). A line starting with '- ' or indented starts a line of its own (a list)."""
    if not text:
        return text
    paragraphs = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in para.split("\n"):
            if lines and line.strip() and not line.startswith((" ", "- ", "* ", "\b")):
                lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
            else:
                lines.append(line.rstrip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def value_metavar(param) -> Optional[str]:
    """What the help shows after an option: nothing for a flag (it takes no value: `--json`, not
    `--json <bool>`), N for a count, else the option's last word in capitals (--piece-size SIZE,
    --seconds SECONDS) instead of Typer's Python type names (`<str>`, `<float>`). None: leave it
    (a metavar given, or choices Typer lists as a|b)."""
    if param.metavar is not None or not isinstance(param, TyperOption):
        return None
    if param.is_flag:
        return ""
    desc = param.type_descriptor
    if desc.is_choice:
        return None
    if desc.annotation is int:
        return "N"
    long = max(param.opts, key=len).lstrip("-")
    return long.rsplit("-", 1)[-1].upper()


def plain_help(command) -> None:
    """One help style for every command and group: reflowed prose, value words instead of type
    names; an argument's type column is left empty (its name, in the first column, says it)."""
    command.help = reflow(command.help)
    command.short_help = reflow(command.short_help)
    for param in command.params:
        if isinstance(param, TyperArgument):
            param.display_type_rich = lambda ctx: None      # not `<list[str]>`: DEST_DIR... says it
            continue
        metavar = value_metavar(param)
        if metavar is not None:
            param.metavar = metavar
        if isinstance(param, TyperOption) and param.help:
            param.help = reflow(param.help)


# A value Click hands over as a string that is plainly an int or a float: digits, a sign, a point,
# an exponent (anything else — "inf", "1_000", " 5", a word — goes through Typer's own parser and
# its messages).
PLAIN_INT = re.compile(r"[+-]?[0-9]+")
PLAIN_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


class PlainValue:
    """The value of a str, bool, int, float or list-of-str parameter, taken as Click parsed it.
    Typer 0.29 builds a pydantic adapter for every parameter it converts, even one left out, and
    importing pydantic alone is a tenth of a second: more than `replicas hash` of a GB from RAM
    takes (docs/replicas.md, "Hashing at the drives' pace"). Only values with one meaning are
    taken here; any other (a word for a number, a value with a range to check) goes to Typer's
    own conversion, so its checks and messages stay as they are."""

    KINDS = {str: None, bool: None, int: PLAIN_INT, float: PLAIN_FLOAT}

    def __init__(self, param):
        self.param = param
        info = param.type_descriptor.parameter_info
        self.ranged = info.min is not None or info.max is not None or info.parser is not None
        self.many = param.multiple or param.nargs == -1
        self.typer_param = None

    @classmethod
    def fits(cls, param) -> bool:
        desc = getattr(param, "type_descriptor", None)
        if desc is None or desc.file_annotation is not None or desc.is_choice:
            return False
        many = param.multiple or param.nargs == -1
        return desc.annotation in ((List[str],) if many else tuple(cls.KINDS))

    def coerce(self, value, param, ctx):
        if value is None:
            return () if self.many else None
        plain = None if self.ranged else self._plain(value)
        if plain is not None:
            return plain
        if self.typer_param is None:
            from typer._coercion import build_runtime_param   # Typer's own, for what is not plain
            self.typer_param = build_runtime_param(self.param.type_descriptor)
        return self.typer_param.coerce(value, param=param, ctx=ctx)

    def _plain(self, value):
        kind = self.param.type_descriptor.annotation
        if self.many:
            return list(value) if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) else None
        if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
            return value
        pattern = self.KINDS[kind]
        if pattern is not None and isinstance(value, str) and pattern.fullmatch(value):
            return kind(value)
        return None


class PlainHelp:
    """Mixed into this project's command and group classes: `plain_help` on construction, and
    for the -h/--help option Click adds later; plain values converted without pydantic
    (`PlainValue`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        plain_help(self)
        for param in self.params:
            if PlainValue.fits(param):
                param._runtime_param = PlainValue(param)

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
            if PlainValue.fits(option) and not isinstance(option._runtime_param, PlainValue):
                option._runtime_param = PlainValue(option)
        return option


class ErrorBoundaryGroup(PlainHelp, TyperGroup):
    """A Typer group whose commands' errors become one line and an exit code."""

    def parse_args(self, ctx, args):
        # Whether --json was asked for is known before any option is parsed, so an error in the
        # parsing itself is a JSON document too. (ctx.meta is shared by every context of a call.)
        ctx.meta.setdefault(JSON_WANTED, json_wanted(args))
        # The app's own options (before the command name) are parsed here, outside invoke.
        try:
            return super().parse_args(ctx, args)
        except click_exceptions.UsageError as e:
            self._usage(ctx, e)

    def invoke(self, ctx):
        if threading.current_thread() is threading.main_thread() and guarded():
            signal.signal(signal.SIGINT, signal.default_int_handler)   # from here on Ctrl-C is caught below
        try:
            return super().invoke(ctx)
        except click_exceptions.UsageError as e:      # the command's arguments, or an unknown command
            self._usage(ctx, e)
        except ReplicaTunerError as e:
            self._fail(ctx, str(e), e.exit_code)
        except KeyboardInterrupt:    # a Ctrl-C no command caught (before its own handler, or a second one)
            self._fail(ctx, INTERRUPTED, EXIT_INTERRUPTED)
        except BrokenPipeError:                 # README: a closed pipe is a quiet 0
            _quiet_stdout()
            raise typer.Exit(0)
        except FileNotFoundError as e:
            self._fail(ctx, f"{e.filename or e}: not found", EXIT_MISSING)
        except NotADirectoryError as e:         # a path of the wrong kind the library did not foresee
            self._fail(ctx, f"{e.filename or e}: a file where a folder was expected; give a folder", EXIT_USAGE)
        except IsADirectoryError as e:
            self._fail(ctx, f"{e.filename or e}: a folder where a file was expected; give a file", EXIT_USAGE)
        except PermissionError as e:
            self._fail(ctx, f"{e.filename or e}: permission denied", EXIT_MISSING)
        except OSError as e:                    # any other errno, in README's table rather than a traceback
            message, code = os_error_line(e)
            self._fail(ctx, message, code)
        except MemoryError:
            self._fail(ctx, "out of memory: the machine has not the RAM this needs; ask for less (a smaller model, "
                            "fewer experts or tokens) or free RAM", EXIT_USAGE)

    def _usage(self, ctx, e: click_exceptions.UsageError):
        """A parse error as one line: what is wrong, and where the help is (exit 2)."""
        if isinstance(e, click_exceptions.NoArgsIsHelpError):
            raise e                                  # a bare command name: its help, as before
        message = " ".join(e.format_message().split())
        for said, plain in PARSE_WORDS:       # the parser's words, in the project's
            message = message.replace(said, plain)
        for said, plain in RANGE_WORDS:
            message = said.sub(plain, message)
        if "unexpected extra argument" in message and BOOL_WORD.search(message):
            message += "; a flag such as --json takes no value: give it alone to turn it on"
        # Some parser errors carry no context; the command being parsed is then the invoked one.
        where = e.ctx.command_path if e.ctx is not None else " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
        self._fail(ctx, f"{message[:1].lower()}{message[1:].rstrip('.')} (see '{where} -h')", EXIT_USAGE)

    def _fail(self, ctx, message: str, code: int):
        if debugging():
            traceback.print_exc()
        typer.echo(f"{ctx.find_root().info_name}: error: {message}", err=True)
        if ctx.meta.get(JSON_WANTED) and not ctx.meta.get(EMITTED):
            print_result(ErrorResult(message, code))   # the result already printed carries its own outcome
        raise typer.Exit(code)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone, so the interpreter's last flush of what
    is still buffered does not fail again (Python's "Exception ignored … BrokenPipeError", exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


# errno -> (what it says of the path, exit code), README's table: a path that can never work as
# given is usage (2), something missing or unreadable 3, a write that cannot land 4.
_ERRNO = {
    errno.ELOOP: ("is a symbolic link loop (or runs through one); give the real path", EXIT_MISSING),   # unreadable
    errno.ENAMETOOLONG: ("name too long; give a shorter path", EXIT_USAGE),
    errno.EIO: ("input/output error (a failing drive or cable?); check the drive", EXIT_MISSING),
    errno.ENXIO: ("no such device (a drive gone?); check the drive", EXIT_MISSING),
    errno.ENOSPC: ("no space left on the device; free space or choose another drive", EXIT_WRITE),
    errno.EDQUOT: ("disk quota exceeded; free space or choose another drive", EXIT_WRITE),
    errno.EFBIG: ("file too large for this file system; choose another drive", EXIT_WRITE),
    errno.EROFS: ("read-only file system; remount it writable or choose another drive", EXIT_WRITE),
}


def os_error_line(e: OSError) -> tuple[str, int]:
    """One line and README's exit code for an OSError nothing more specific caught."""
    where = e.filename or "a file"
    said, code = _ERRNO.get(e.errno, (None, EXIT_MISSING))
    return f"{where}: {said or (e.strerror or str(e))}", code


class PlainUsageCommand(PlainHelp, TyperCommand):
    """A command whose usage line names its arguments as POSIX tools do: `SOURCE DEST_DIR...`,
    `[PATH]...` (Typer writes required ones in braces, `{SOURCE} {DEST_DIR}...`). Every number
    option the user gives is finite: nan, inf and 1e400 (a float's inf) are one line, exit 2,
    before the command runs — checked here once, so no command can forget (a NaN passes every
    `x <= 0` range check, and `int(x * 1e9)` of inf is a traceback)."""

    def invoke(self, ctx):
        for param in self.get_params(ctx):
            value = ctx.params.get(param.name) if param.name else None
            values = value if isinstance(value, (list, tuple)) else (value,)
            if any(finite_or_none(v) is None and v is not None for v in values):
                name = max(param.opts, key=len) if getattr(param, "opts", None) else (param.name or "").upper()
                raise UsageError(f"{name} {values[0] if len(values) == 1 else list(values)}: give a finite number")
        return super().invoke(ctx)

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                pieces.append(plain_usage(param))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


def plain_usage(param: TyperArgument) -> str:
    """An argument on the usage line: its metavar (else its name in capitals), in brackets when
    optional, '...' after it when it takes several."""
    name = param.metavar or (param.name or "").upper()
    if not param.required:
        name = f"[{name}]"
    return name + ("..." if param.nargs != 1 else "")


class App(typer.Typer):
    """Typer with this project's command class as the default, for sub-apps added too."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or PlainUsageCommand, **kwargs)

    def add_typer(self, typer_instance: typer.Typer, **kwargs):
        for info in typer_instance.registered_commands:
            if info.cls is None:
                info.cls = PlainUsageCommand
        return super().add_typer(typer_instance, **kwargs)


# Said once in every app's help: which units the numbers it prints are in (core.units).
UNITS_HELP = ("Sizes are binary (KiB, MiB, GiB: powers of 1024 bytes); rates are decimal "
              "(MB/s, GB/s: powers of 1000 bytes per second), as drive makers and fio count.")


def make_app(name: str, help: str) -> typer.Typer:
    app = App(name=name, help=f"{help}\n\n{UNITS_HELP}", cls=ErrorBoundaryGroup, no_args_is_help=True,
              add_completion=False, pretty_exceptions_enable=False,
              context_settings={"help_option_names": ["-h", "--help"]})

    @app.callback()
    def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors.")):
        if debug:
            os.environ[DEBUG_ENV] = "1"

    return app


def _check_rig(ctx: typer.Context, param: typer.CallbackParam, value: Optional[str]) -> Optional[str]:
    """A rig path of the wrong kind (a file) is refused while parsing, in every command that takes --rig."""
    from_env = ctx.get_parameter_source(param.name) == click_core.ParameterSource.ENVIRONMENT
    rig_dir(None if from_env else value)      # from the environment: named as $REPLICA_TUNER_RIG
    return value


RigOption = typer.Option(None, "--rig", envvar=RIG_ENV, show_envvar=False, metavar="DIR", callback=_check_rig,
                         help=f"Rig folder (default: ${RIG_ENV}, else ./rig).")
JsonOption = typer.Option(False, "--json", help="Print the result as JSON on stdout.")
QuietOption = typer.Option(False, "--quiet", "-q", help="No progress and no notices: only the result, warnings and errors.")


def require_terminal(what: str, instead: str) -> None:
    """Refuse (exit 2) to open a full-screen program where no one can use it: its input and output
    must both be a terminal. Without this a screen app piped or fed /dev/null writes escape codes
    until killed."""
    missing = [name for name, stream in (("input", sys.stdin), ("output", sys.stdout))
               if stream is None or not stream.isatty()]
    if missing:
        raise UsageError(f"{what} needs a terminal (its {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                         f"not one); run it in a terminal, or {instead}")


JSON_WANTED = "replica_tuner.json"     # ctx.meta keys: --json was given; a result was printed
EMITTED = "replica_tuner.emitted"


def json_wanted(args: list[str]) -> bool:
    """--json among a command line's options (not after `--`, where an engine's arguments are)."""
    args = list(args)
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def print_result(result: Result) -> None:
    """Print a command's result as JSON on stdout, in the one envelope of core.results. The only
    way a command prints JSON: there is no entry point that takes a bare dict."""
    sys.stdout.write(json.dumps(envelope(result), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()
    ctx = get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[EMITTED] = True


def finish(code: int) -> None:
    """End a command that has printed its result with the exit code its outcome gives (0: return
    normally; a result's own `exit_code`, or the command's documented code for what it found). With
    the boundary's map from errors to codes (`ErrorBoundaryGroup`), the one way a command ends with
    a code."""
    if code:
        raise typer.Exit(code)


def run(app: typer.Typer, name: Optional[str] = None) -> None:
    """Console-script entry point. A Ctrl-C while the command line is still being parsed (nothing
    has been done yet) is the one line and exit 130, not Typer's silent 130 or a traceback; once a
    command runs, the boundary (ErrorBoundaryGroup.invoke) takes Ctrl-C back as KeyboardInterrupt."""
    guard(name or os.path.basename(sys.argv[0]))     # usually already on, from the package's __init__
    app(prog_name=name)
