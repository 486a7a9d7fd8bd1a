"""What every console script shares: the error boundary, --debug, consoles, the --rig option.

Errors from the library arrive as `ReplicaTunerError`s; here, and only here, they become one
line on stderr and the documented exit code. `--debug` (or REPLICA_TUNER_DEBUG=1) shows the
traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Optional

import typer
from rich.console import Console
from typer.core import TyperGroup

from .constants import DEBUG_ENV, RIG_ENV
from .errors import EXIT_INTERRUPTED, EXIT_MISSING, ReplicaTunerError

out = Console()                          # data and tables: stdout
err = Console(stderr=True)               # progress and messages: stderr


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


class ErrorBoundaryGroup(TyperGroup):
    """A Typer group whose commands' errors become one line and an exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ReplicaTunerError as e:
            self._fail(ctx, str(e), e.exit_code)
        except KeyboardInterrupt:
            self._fail(ctx, "interrupted", EXIT_INTERRUPTED)
        except BrokenPipeError:
            raise typer.Exit(0)
        except FileNotFoundError as e:
            self._fail(ctx, f"{e.filename or e}: not found", EXIT_MISSING)
        except PermissionError as e:
            self._fail(ctx, f"{e.filename or e}: permission denied", EXIT_MISSING)

    def _fail(self, ctx, message: str, code: int):
        if debugging():
            traceback.print_exc()
        typer.echo(f"{ctx.find_root().info_name}: error: {message}", err=True)
        raise typer.Exit(code)


def make_app(name: str, help: str) -> typer.Typer:
    app = typer.Typer(name=name, help=help, cls=ErrorBoundaryGroup, no_args_is_help=True,
                      add_completion=False, pretty_exceptions_enable=False,
                      context_settings={"help_option_names": ["-h", "--help"]})

    @app.callback()
    def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors.")):
        if debug:
            os.environ[DEBUG_ENV] = "1"

    return app


RigOption = typer.Option(None, "--rig", envvar=RIG_ENV, metavar="DIR",
                         help=f"Rig folder (default: ${RIG_ENV}, else ./rig).")
JsonOption = typer.Option(False, "--json", help="Print the result as JSON on stdout.")


def print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def run(app: typer.Typer, name: Optional[str] = None) -> None:
    """Console-script entry point."""
    app(prog_name=name)
