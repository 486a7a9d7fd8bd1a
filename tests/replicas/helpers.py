"""Plain helpers for the replicas tests (imported as `tests.replicas.helpers`)."""

import os

from typer.testing import CliRunner

from replicas.cli import app
from replicas.sync import sync
from tests.helpers import model_and_drives

MiB = 1 << 20
PIECE = MiB
runner = CliRunner()


def invoke(*args, **kwargs):
    return runner.invoke(app, [str(a) for a in args], **kwargs)


def synced_rig(tmp_path, size=6 * MiB + 777, seed=2, piece=PIECE):
    """A primary and two verified replicas: (rig dir, the bytes, [primary, replica, replica])."""
    src, data, dests = model_and_drives(tmp_path, size, seed=seed)
    rig = str(tmp_path / "rig")
    assert sync(str(src), [str(d) for d in dests], rig, piece_size=piece, allow_same_device=True).exit_code == 0
    return rig, data, [str(src)] + [str(d / "model.gguf") for d in dests]


def flip_byte(path, offset, keep_mtime=False):
    """Damage one byte in place, as a failing drive would; keep_mtime hides it from quick verify."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


class FakeClock:
    """An injected clock for --max-rate: sleeping moves its time on, nothing waits."""

    def __init__(self):
        self.t = 0.0
        self.slept = 0.0

    def now(self):
        return self.t

    def sleep(self, seconds, cancel=None):
        self.t += seconds
        self.slept += seconds
