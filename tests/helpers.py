"""Plain helpers shared by the test folders (imported as `tests.helpers`); fixtures live in conftest.py."""

import errno
import threading

from replicas.coldio import ColdReader


def write_random(path, size, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        f.write(data)
    return data


def model_and_drives(tmp_path, size, seed):
    """A random 'model' on an 'internal' folder and two empty destination folders (green, white):
    returns (source path, its bytes, [destination dirs])."""
    src = tmp_path / "internal" / "model.gguf"
    src.parent.mkdir()
    data = write_random(src, size, seed=seed)
    dests = [tmp_path / "green", tmp_path / "white"]
    for d in dests:
        d.mkdir()
    return src, data, dests


IMPURE = frozenset({"os", "threading", "time", "queue", "concurrent", "subprocess", "socket", "mmap", "typer",
                    "textual", "rich"})


def impure_imports(module) -> list[str]:
    """The imports of a module (its own source, functions included) that a pure module must not
    make: disk, threads, clocks, processes, UI. Empty for a pure module."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [f"line {node.lineno}: {n}" for n in names if n.split(".")[0] in IMPURE]
    return found


class FailingReads:
    """Breaks a reader on purpose, as a dying drive would: when its path is in `broken` (path ->
    reads that still succeed), every read after those raises OSError(EIO) naming the path.
    `broken` is per class: set it in each test. Mix it in front of any reader class."""

    broken: dict = {}

    def __init__(self, path):
        super().__init__(path)
        self.calls = 0
        self.lock = threading.Lock()

    def read_into(self, buffer, offset):
        rule = self.broken.get(self.path)
        if rule is not None:
            with self.lock:
                self.calls += 1
                n = self.calls
            if n > rule:
                raise OSError(errno.EIO, "Input/output error", self.path)
        return super().read_into(buffer, offset)


class FailingReader(FailingReads, ColdReader):
    """The failing-on-purpose cold reader (e.g. a SplitReader's `opener`), so failover and the
    errors above a reader are tested without breaking a disk."""

    broken: dict = {}
