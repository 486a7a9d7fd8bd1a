"""`engine-bridge`: the split reader, the embedded MoE engine, the harness and engine profiles.

Each group of commands lives in its own module and registers itself here, so the run, harness
and profile commands can grow independently.
"""

from __future__ import annotations

from core.cli import make_app, run

from .commands import autotune as cli_autotune
from .commands import bench as cli_bench
from .commands import export as cli_export
from .commands import run as cli_run

app = make_app("engine-bridge", "Run plans: split reads, the embedded MoE engine, the harness, and engine profiles.")

for _module in (cli_run, cli_bench, cli_export, cli_autotune):
    _module.register(app)


def main() -> None:
    run(app, "engine-bridge")


if __name__ == "__main__":
    main()
