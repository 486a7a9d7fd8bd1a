"""`engine-bridge`: the split reader, the embedded MoE engine, the harness and engine profiles.

Each group of commands lives in its own module and registers itself here, so the run, harness
and profile commands can grow independently.
"""

from __future__ import annotations

from core.cli import make_app, run

from .commands import embedded as cli_embedded
from .commands import harness as cli_harness
from .commands import profiles as cli_profiles
from .commands import tuning as cli_tuning
from .commands import tunerig as cli_tunerig

app = make_app("engine-bridge", "Run plans: split reads, the embedded MoE engine, the harness, and engine profiles.")

for _module in (cli_embedded, cli_harness, cli_profiles, cli_tuning, cli_tunerig):
    _module.register(app)


def main() -> None:
    run(app, "engine-bridge")


if __name__ == "__main__":
    main()
