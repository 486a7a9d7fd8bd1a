"""engine-bridge commands: synth, run and replay (the embedded engine)."""


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""
