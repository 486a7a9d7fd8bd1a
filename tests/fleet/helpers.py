"""Plain helpers for the fleet tests: a node's rig with a small real model on three folders."""

import os
import shutil

from engine_bridge.moe.synth import SynthSpec, synthesize
from fleet.job import BenchSettings
from replicas.sync import sync
from tests.replicas.helpers import invoke

PIECE = 1 << 20
# A small MoE GGUF laid out like the real one (experts expert-major, 4 KiB aligned), a few MiB:
# enough pieces that a flipped byte names one, small enough that three nodes measure it in seconds.
SPEC = SynthSpec(layers=2, experts=8, top_k=2, dim=256, ff=512, vocab=128, seed=7, quant="q8_0")

# A short measurement: seq and decode shapes at one lane (the model is a few MiB); windows long enough
# that a busy machine still completes reads in each (a window with none measures 0 B/s).
QUICK = BenchSettings(presets=("seq", "decode"), lanes=(1,), seconds=0.2, repeat=1)


def model_file(folder) -> str:
    path = os.path.join(str(folder), "model.gguf")
    synthesize(path, SPEC)
    return path


def node_rig(root, model: str) -> str:
    """A node's rig at root/rig: the model copied to root/internal (the primary) and synced to
    root/green and root/white (verified, stamped). Returns the rig folder."""
    internal = os.path.join(str(root), "internal")
    os.makedirs(internal, exist_ok=True)
    primary = os.path.join(internal, "model.gguf")
    shutil.copyfile(model, primary)
    rig = os.path.join(str(root), "rig")
    assert invoke("init", "--rig", rig, "--model", primary, "--name", "internal").exit_code == 0
    dests = []
    for name in ("green", "white"):
        d = os.path.join(str(root), name)
        os.makedirs(d, exist_ok=True)
        dests.append(d)
    assert sync(primary, dests, rig, piece_size=PIECE, allow_same_device=True).exit_code == 0
    return rig


def fleet_file(path, nodes: dict[str, str], **top) -> str:
    """A fleet file at `path`: {node name: rig folder}, plus top-level keys (manifest, upstream, engine)."""
    lines = [f'{k} = "{v}"' for k, v in top.items()]
    for name, rig in nodes.items():
        lines += ["", "[[node]]", f'name = "{name}"', f'rig = "{rig}"']
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


class Sabotaged:
    """A node's work that never returns on the nodes in `hang` (as a hung drive would leave it),
    raises on those in `broken` (a bug in the job), and is the real job elsewhere: the fleet's
    timeout, lost-node and failed-job paths, with outcomes that never depend on timing."""

    def __init__(self, hang=(), broken=()):
        self.hang, self.broken = frozenset(hang), frozenset(broken)

    def __call__(self, job):
        import threading

        from fleet.node import run_node

        if job.node in self.hang:
            threading.Event().wait()
        if job.node in self.broken:
            raise RuntimeError(f"broken on purpose on {job.node}")
        return run_node(job)
