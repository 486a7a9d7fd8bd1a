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


SET_PIECE = 64 * 1024      # small pieces so every file of a test model has several


def write_model(folder, kind, seed=5):
    """A real multi-file model in `folder` (created): 'split', a GGUF set of 3 files written by the
    gguf library, or 'dir', a safetensors directory of 3 shards with index, config and tokenizer
    (and one file in a sub-folder). Returns the path an engine is pointed at (first file / directory)."""
    from tests.helpers import write_safetensors_dir, write_split_gguf

    if kind == "split":
        return str(write_split_gguf(folder, "moe", 3, tensors_per_part=2, tensor_bytes=150_000, seed=seed)[0])
    return str(write_safetensors_dir(os.path.join(folder, "moe"), 3, shard_bytes=300_000, seed=seed,
                                     extra_files={"extra/generation_config.json": b'{"top_k": 4}'}))


def model_rig(tmp_path, kind):
    """A rig whose model (kind 'split' or 'dir', see write_model) is on 'internal', synced to
    'green' and 'white' (verified and stamped): (rig dir, [primary, green, white] model paths)."""
    from models.modelset import discover

    primary = write_model(tmp_path / "internal", kind)
    rig = str(tmp_path / "rig")
    assert invoke("init", "--rig", rig, "--model", primary, "--name", "internal").exit_code == 0
    dests = [tmp_path / "green", tmp_path / "white"]
    for d in dests:
        d.mkdir()
    res = sync(primary, [str(d) for d in dests], rig, piece_size=SET_PIECE, allow_same_device=True)
    assert res.exit_code == 0
    return rig, [primary] + [discover(primary).in_dir(str(d)).path for d in dests]
