"""engine-bridge commands: bench and ladder (the harness)."""


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""
