"""engine-bridge commands: export, profiles and launch (engine profiles)."""


def register(app) -> None:
    """Add this module's commands to the engine-bridge app."""
