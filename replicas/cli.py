"""`replicas`: keep byte-identical copies of a model on several drives, and prove it."""

from __future__ import annotations

import os
from typing import List, Optional

import typer

from . import rig as rigmod
from .cli_support import JsonOption, RigOption, err, make_app, out, print_json, run
from .constants import PIECE_SIZE
from .drives import drive_of
from .errors import MissingError, UsageError
from .hashing import hash_file
from .manifest import manifest_to_dict
from .units import parse_size

app = make_app("replicas", "Keep byte-identical replicas of a model file on several drives, and prove they are identical.")


@app.command()
def init(rig: Optional[str] = RigOption,
         model: str = typer.Option(..., "--model", metavar="PATH", help="The model file (the engine's -m, the primary)."),
         name: Optional[str] = typer.Option(None, "--name", help="Drive label for the model (default: its mount point's name).")):
    """Create rig.toml naming the model (the primary); replicas are added by `replicas sync`."""
    root = rigmod.rig_dir(rig)
    if not os.path.isfile(model):
        raise MissingError(f"{model}: not a regular file; give the model file with --model")
    current = rigmod.load_rig(root, must_exist=False)
    updated = rigmod.with_model(current, model, name or drive_of(model).label)
    rigmod.save_rig(updated)
    err.print(f"rig at {root}: model {updated.model.path} on drive '{updated.model.name}'")


@app.command("hash")
def hash_cmd(path: str = typer.Argument(..., help="File to hash."),
             piece_size: str = typer.Option("64M", "--piece-size", help="Piece size (binary units: 64M = 64 MiB)."),
             json_out: bool = JsonOption):
    """Print the file's BLAKE3 as b3sum does (`<hex>  <path>`), read cold; --json adds the piece hashes."""
    if not os.path.exists(path):
        raise MissingError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: not a regular file")
    m = hash_file(path, parse_size(piece_size, "--piece-size"))
    if json_out:
        d = manifest_to_dict(m)
        d["path"] = path
        print_json(d)
    else:
        typer.echo(f"{m.blake3}  {path}")


def main() -> None:
    run(app, "replicas")
