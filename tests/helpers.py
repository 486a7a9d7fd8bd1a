"""Plain helpers shared by the test folders (imported as `tests.helpers`); fixtures live in conftest.py."""

import errno
import threading
from collections import Counter
from contextlib import contextmanager

from core.coldio import ColdReader


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
    import os
    import sys

    # its .py, beside it: a module the build compiled (docs/reader.md "Compiled") is a shared library
    pkg, _, name = module.__name__.rpartition(".")
    src = os.path.join(sys.modules[pkg].__path__[0], name + ".py")
    with open(src, encoding="utf-8") as f:
        tree = ast.parse(f.read())
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


def write_split_gguf(dir, prefix, parts, tensors_per_part=2, tensor_bytes=4096, seed=0, arch="llama"):
    """A real split GGUF set written by the gguf library (llama.cpp's own writer): `parts` files
    PREFIX-0000i-of-0000N.gguf in `dir`, each with split.no / split.count metadata and
    `tensors_per_part` int8 tensors of `tensor_bytes` random bytes (deterministic from `seed`), so a
    part is about tensors_per_part * tensor_bytes bytes plus a small header. Returns the paths in
    set order (the first is the one engines open)."""
    import pathlib

    import gguf
    import numpy as np

    dir = pathlib.Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(dir / f"{prefix}.gguf"), arch, split_max_tensors=tensors_per_part if parts > 1 else 0)
    w.add_uint32(f"{arch}.block_count", parts)
    for i in range(parts * tensors_per_part):
        w.add_tensor(f"blk.{i}.weight", rng.integers(-128, 128, tensor_bytes, dtype=np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if parts == 1:
        return [dir / f"{prefix}.gguf"]
    paths = [dir / f"{prefix}-{i:05d}-of-{parts:05d}.gguf" for i in range(1, parts + 1)]
    assert all(p.is_file() for p in paths), "the gguf library named the split files differently"
    return paths


def write_safetensors_dir(dir, shards, shard_bytes=8192, tensors_per_shard=2, seed=0, extra_files=None):
    """A real Hugging Face style safetensors model directory at `dir` (created): `shards` files
    model-0000i-of-0000N.safetensors written by the safetensors library, each with
    `tensors_per_shard` float32 tensors totalling about `shard_bytes` bytes of random data
    (deterministic from `seed`) plus its JSON header; model.safetensors.index.json with the
    weight_map and total_size; a small config.json and tokenizer.json. `extra_files` maps more
    '/'-separated relative paths to bytes (nested folders made). Returns the directory's path."""
    import json
    import pathlib

    import numpy as np
    from safetensors.numpy import save_file

    dir = pathlib.Path(dir)
    dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per_tensor = max(1, shard_bytes // tensors_per_shard // 4)   # float32 elements
    weight_map, total = {}, 0
    for s in range(1, shards + 1):
        name = f"model-{s:05d}-of-{shards:05d}.safetensors"
        tensors = {f"model.layers.{s - 1}.w{t}": rng.standard_normal(per_tensor, dtype=np.float32)
                   for t in range(tensors_per_shard)}
        save_file(tensors, str(dir / name), metadata={"format": "pt"})
        for t, a in tensors.items():
            weight_map[t] = name
            total += a.nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    (dir / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": shards,
                                                 "torch_dtype": "float32"}, indent=2))
    (dir / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1},
                                                                                "merges": []}}))
    for rel, data in (extra_files or {}).items():
        p = dir.joinpath(*rel.split("/"))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return dir


@contextmanager
def counting_opens():
    """A Counter of the paths `open` opened while the block ran (how often a command reads a file)."""
    import builtins

    opened, real_open = Counter(), builtins.open

    def counting_open(file, *args, **kwargs):
        opened[str(file)] += 1
        return real_open(file, *args, **kwargs)

    builtins.open = counting_open
    try:
        yield opened
    finally:
        builtins.open = real_open


# -- the real llama.cpp ----------------------------------------------------------------------------

LLAMA_CPP_ENV = "LLAMA_CPP_BIN_DIR"       # the folder of llama.cpp's binaries (bench/build_llama_cpp.sh prints it)


def llama_cpp_bin(name: str) -> str | None:
    """The path of llama.cpp's binary `name` in $LLAMA_CPP_BIN_DIR, or None when it is not there."""
    import os

    folder = os.environ.get(LLAMA_CPP_ENV, "")
    path = os.path.join(folder, name)
    return path if folder and os.path.isfile(path) and os.access(path, os.X_OK) else None


def needs_llama_cpp(*names: str):
    """Skip (saying why) unless $LLAMA_CPP_BIN_DIR holds every one of llama.cpp's binaries `names`."""
    import os

    import pytest

    folder = os.environ.get(LLAMA_CPP_ENV, "")
    missing = [n for n in names if llama_cpp_bin(n) is None]
    why = (f"{LLAMA_CPP_ENV} is not set: point it at the bin folder of a llama.cpp build "
           "(bench/build_llama_cpp.sh builds one; see docs/engine.md)" if not folder
           else f"{LLAMA_CPP_ENV}={folder} has no executable {', '.join(missing)}")
    return pytest.mark.skipif(bool(missing), reason=why)


COMPLETION_FLAGS = ("--temp", "0", "--seed", "42", "-t", "1", "-no-cnv", "--no-display-prompt", "--ignore-eos")


def llama_completion(model, prompt: str, n: int, cwd=None) -> tuple[bytes, bool]:
    """(stdout, complete) of llama-completion generating `n` tokens greedily on one thread (OpenMP's
    spinning threads crawl on a loaded machine), end-of-generation tokens ignored.

    It prints the text, then "\\n\\n", through its logger's worker thread, and that logger is never
    flushed at exit (llama.cpp common/log.cpp `common_log_main`: "this design may cause logs to be
    lost if not flushed before the program exits"): when a small model generates faster than the
    worker writes, the process ends with rc 0 and its stdout cut short, anywhere (docs/engine.md).
    The worker writes stdout and stderr lines in the order they were logged and the
    `common_perf_print:` lines come last, so `complete` is whether stderr shows one."""
    import subprocess

    p = subprocess.run([llama_cpp_bin("llama-completion"), "-m", str(model), "-p", prompt, "-n", str(n), *COMPLETION_FLAGS],
                       capture_output=True, timeout=300, cwd=cwd, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    return p.stdout, b"common_perf_print:" in p.stderr


def llama_simple(model, prompt: str, n: int, cwd=None) -> bytes:
    """The bytes llama-simple generates for `prompt` (`n` tokens, greedy; one OpenMP thread): it
    prints the prompt's pieces, then each token from the main thread (printf, fflush), then "\\n",
    so its stdout is complete whenever it exits 0. It stops early at an end-of-generation token."""
    import os
    import subprocess

    p = subprocess.run([llama_cpp_bin("llama-simple"), "-m", str(model), "-n", str(n), prompt], capture_output=True,
                       timeout=300, cwd=cwd, stdin=subprocess.DEVNULL, env={**os.environ, "OMP_THREAD_LIMIT": "1"})
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-3000:]
    head = prompt.encode()
    assert p.stdout.startswith(head) and p.stdout.endswith(b"\n"), p.stdout
    return p.stdout[len(head):-1]
