"""Models as users have them: formats, the set of files, tensor tables, expert geometry, the
routing model and the one expert-cache policy (docs/architecture.md)."""
