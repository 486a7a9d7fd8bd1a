"""replicas on throttled drives, side by side with the yardsticks, from one run.

Builds 3 throttled drives (bench/testbed.py: root, Linux; exits 2 where there is no testbed) and,
for each case, writes a model on the first, then times, each from a cold page cache:

  file case (one random model file)
    sync    `replicas sync` to 2 destinations (with and without the cold read-back) vs the ideal
            (max of the source's read time and the slowest destination's write time, from fio
            ceilings measured in the same run) and vs `rsync --fsync` to each destination in turn
    verify  `replicas verify --full` of the 3 members vs the ideal (slowest drive's size/ceiling)
            and vs `b3sum` over the same files one after another
    targets: verify within 1.1x of ideal; sync within 1.2x of ideal.

  dir case (a safetensors directory: SHARDS shards of random tensor bytes with their index,
  config and tokenizer, SIZE in all; issue 10)
    sync    the whole directory to 2 destinations, files in order: --no-verify vs the copy ideal,
            the default (read-back per file) vs the copy ideal plus the slowest read-back; beside
            it `rsync -a --fsync --whole-file` of the directory to each destination in turn
    verify  `replicas verify --full` of the 3 members (every file) vs the ideal; beside it
            `b3sum` over the same files, member after member
    targets: sync at >= 0.85 of its ideal, verify --full at >= 0.93 (ideal / measured).

  python bench/replicas_bench.py [--case file|dir|all] [--size 2G] [--shards 10]
                                 [--read internal:300,green:150,white:150] [--write-mbs 150]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.testbed import Testbed, drop_caches, fio_seq, parse_drives, wait_writeback, write_random  # noqa: E402
from core.units import parse_size  # noqa: E402

REPLICAS = os.path.join(os.path.dirname(sys.executable), "replicas")
WARM = [REPLICAS, "verify", "--help"]   # load the tool's code (not the data) after dropping caches
DIR_SYNC_TARGET = 0.85      # ideal / measured, dir case
DIR_VERIFY_TARGET = 0.93


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=("file", "dir", "all"), default="all")
    ap.add_argument("--size", default="2G", help="the model's bytes (dir case: all shards together)")
    ap.add_argument("--shards", type=int, default=10, help="dir case: safetensors shards")
    ap.add_argument("--read", default="internal:300,green:150,white:150", help="NAME:MB/s read ceilings; the first holds the "
                                                                               "source")
    ap.add_argument("--write-mbs", type=float, default=150)
    a = ap.parse_args()
    if a.shards < 1:
        raise SystemExit("--shards must be at least 1")
    size = parse_size(a.size)
    ceilings = parse_drives(a.read, "--read")
    failed = False
    if a.case in ("file", "all"):
        file_case(size, ceilings, a)
    if a.case in ("dir", "all"):
        failed = not dir_case(size, a.shards, ceilings, a)
    sys.exit(1 if failed else 0)


def measure_ceilings(tb: Testbed, src_name: str, src_file: str, src_bytes: int, dst_names: list[str],
                     probe_bytes: int) -> tuple[dict[str, float], dict[str, float]]:
    """Ceilings measured in this run, with fio (bw_bytes), on these drives: the source's read of
    its file, each destination's write and read of a probe file. Returns (read_bw, write_bw)."""
    read_bw = {src_name: fio_seq(tb, src_file, "read", src_bytes)}
    write_bw = {}
    for n in dst_names:
        probe = os.path.join(tb.mount(n), "fio-probe")
        write_bw[n] = fio_seq(tb, probe, "write", probe_bytes)
        read_bw[n] = fio_seq(tb, probe, "read", probe_bytes)
        os.unlink(probe)
    return read_bw, write_bw


def rsync_in_turn(tb: Testbed, dst_names: list[str], args: list[str]) -> float:
    """Seconds for `rsync ARGS DEST/` to each destination in turn (the usual way), cold."""
    rs_dirs = [os.path.join(tb.mount(n), "rsync") for n in dst_names]
    for d in rs_dirs:
        os.makedirs(d)
    t = 0.0
    drop_caches()
    for d in rs_dirs:
        t += tb.timed(["rsync", *args, d + "/"], cold=False)
    for d in rs_dirs:
        shutil.rmtree(d)
    return t


def file_case(size: int, ceilings: dict[str, float], a) -> None:
    names = list(ceilings)
    src_name, dst_names = names[0], names[1:3]
    with Testbed(ceilings, write_mbs=a.write_mbs) as tb:
        src = os.path.join(tb.mount(src_name), "model.gguf")
        print(f"testbed: read {a.read} MB/s, write {a.write_mbs:g} MB/s; model {size / 1e9:.2f} GB", flush=True)
        write_random([src], size, seed=1)

        read_bw, write_bw = measure_ceilings(tb, src_name, src, size, dst_names, min(size, 512 << 20))
        # rsync to each destination in turn, made durable like ours.
        t_rsync = rsync_in_turn(tb, dst_names, ["--fsync", "--whole-file", src])

        # replicas sync without the read-back (the copy itself), then with it (the default).
        def sync_to(sub: str, rig: str, extra: list[str]) -> float:
            dirs = [os.path.join(tb.mount(n), sub) for n in dst_names]
            for d in dirs:
                os.makedirs(d)
            return tb.timed([REPLICAS, "sync", "--rig", rig, src, *dirs, *extra], warm=WARM)

        scratch_rig = os.path.join(tb.root, "rig-noverify")
        t_sync_nv = sync_to("nv", scratch_rig, ["--no-verify"])
        for n in dst_names:
            shutil.rmtree(os.path.join(tb.mount(n), "nv"))
        rig = os.path.join(tb.root, "rig")
        t_sync = sync_to("replica", rig, [])

        # verify --full of the 3 members vs b3sum one file after another.
        members = [src] + [os.path.join(tb.mount(n), "replica", "model.gguf") for n in dst_names]
        t_verify = tb.timed([REPLICAS, "verify", "--rig", rig, "--full"], warm=WARM)
        drop_caches()
        subprocess.run(["b3sum", "--help"], capture_output=True)
        t_b3 = 0.0
        for m in members:
            t_b3 += tb.timed(["b3sum", m], cold=False)

    ideal_copy = max(size / read_bw[src_name], max(size / write_bw[n] for n in dst_names))
    ideal_readback = ideal_copy + max(size / read_bw[n] for n in dst_names)
    ideal_verify = max(size / read_bw[n] for n in [src_name] + dst_names)
    rows = [
        ("ceilings (fio, MB/s)", " ".join(f"{n}: read {read_bw[n] / 1e6:.0f}"
                                          + (f" write {write_bw[n] / 1e6:.0f}" if n in write_bw else "") for n in read_bw)),
        ("sync --no-verify to 2", f"{t_sync_nv:7.2f} s  ideal {ideal_copy:6.2f} s  ratio {t_sync_nv / ideal_copy:.3f}x "
                                  f"(target <= 1.2)   rsync in turn {t_rsync:6.2f} s  ({t_rsync / t_sync_nv:.2f}x slower)"),
        ("sync to 2 + read-back", f"{t_sync:7.2f} s  ideal {ideal_readback:6.2f} s  ratio {t_sync / ideal_readback:.3f}x "
                                  f"(copy ideal + slowest read-back)   vs copy-only ideal {t_sync / ideal_copy:.3f}x   rsync "
                                  f"in turn (no verify) {t_rsync:6.2f} s"),
        ("verify --full of 3", f"{t_verify:7.2f} s  ideal {ideal_verify:6.2f} s  ratio {t_verify / ideal_verify:.3f}x "
                               f"(target <= 1.1)   b3sum in turn {t_b3:6.2f} s  ({t_b3 / t_verify:.2f}x slower)"),
    ]
    for k, v in rows:
        print(f"{k:24s} {v}")
    print(json.dumps({"case": "file", "size": size, "read_bw": read_bw, "write_bw": write_bw, "rsync_s": t_rsync,
                      "sync_noverify_s": t_sync_nv, "sync_s": t_sync, "verify_s": t_verify, "b3sum_s": t_b3,
                      "ideal_copy_s": ideal_copy, "ideal_readback_s": ideal_readback, "ideal_verify_s": ideal_verify}))


# ---------------------------------------------------------------------------------------------
# The directory case (issue 10): a safetensors checkpoint of several shards.

def write_safetensors_shard(path: str, nbytes: int, seed: int) -> None:
    """A real safetensors file, written by the safetensors library (numpy API), holding one U8
    tensor of `nbytes` random bytes; fsynced."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"weight": np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)}, path,
              metadata={"format": "pt"})
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(folder: str, size: int, shards: int) -> list[str]:
    """A Hugging Face style directory of `shards` shards (`size` bytes of tensors in all), its
    index, config and tokenizer; returns its files' paths."""
    os.makedirs(folder)
    per = size // shards
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    for i, n in enumerate(names):
        write_safetensors_shard(os.path.join(folder, n), per if i < shards - 1 else size - per * (shards - 1), seed=i)
    side = {"model.safetensors.index.json": {"metadata": {"total_size": size},
                                             "weight_map": {f"layers.{i}.weight": n for i, n in enumerate(names)}},
            "config.json": {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": shards},
            "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}}}
    for n, doc in side.items():
        with open(os.path.join(folder, n), "w") as f:
            json.dump(doc, f)
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def tree_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def dir_case(size: int, shards: int, ceilings: dict[str, float], a) -> bool:
    """Returns whether both targets were met."""
    names = list(ceilings)
    src_name, dst_names = names[0], names[1:3]
    with Testbed(ceilings, write_mbs=a.write_mbs) as tb:
        src = os.path.join(tb.mount(src_name), "moe")
        print(f"testbed: read {a.read} MB/s, write {a.write_mbs:g} MB/s; directory model of {shards} shards, "
              f"{size / 1e9:.2f} GB", flush=True)
        files = write_checkpoint(src, size, shards)
        total = sum(os.path.getsize(f) for f in files)
        biggest = max(files, key=os.path.getsize)
        print(wait_writeback(), flush=True)

        # whole MiB of the largest shard: fio's block size
        read_bw, write_bw = measure_ceilings(tb, src_name, biggest, os.path.getsize(biggest) >> 20 << 20, dst_names,
                                             min(total, 512 << 20))
        # rsync -a of the directory to each destination in turn, made durable like ours.
        t_rsync = rsync_in_turn(tb, dst_names, ["-a", "--fsync", "--whole-file", src])

        def sync_to(sub: str, rig: str, extra: list[str]) -> float:
            dirs = [os.path.join(tb.mount(n), sub) for n in dst_names]
            for d in dirs:
                os.makedirs(d)
            return tb.timed([REPLICAS, "sync", "--rig", rig, "--quiet", src, *dirs, *extra], warm=WARM)

        t_sync_nv = sync_to("nv", os.path.join(tb.root, "rig-dir-noverify"), ["--no-verify"])
        for n in dst_names:
            shutil.rmtree(os.path.join(tb.mount(n), "nv"))
        rig = os.path.join(tb.root, "rig-dir")
        t_sync = sync_to("replica", rig, [])
        copies = [os.path.join(tb.mount(n), "replica", "moe") for n in dst_names]
        for c in copies:     # the bytes are the source's, file for file
            if [os.path.relpath(f, c) for f in tree_files(c)] != [os.path.relpath(f, src) for f in files]:
                raise SystemExit(f"{c}: does not hold the model's files after sync")

        # verify --full of the 3 members vs b3sum over the same files, member after member.
        t_verify = tb.timed([REPLICAS, "verify", "--rig", rig, "--full", "--quiet"], warm=WARM)
        drop_caches()
        subprocess.run(["b3sum", "--help"], capture_output=True)
        t_b3 = 0.0
        for m in [src] + copies:
            t_b3 += tb.timed(["b3sum", *tree_files(m)], cold=False)

    ideal_copy = max(total / read_bw[src_name], max(total / write_bw[n] for n in dst_names))
    ideal_readback = ideal_copy + max(total / read_bw[n] for n in dst_names)
    ideal_verify = max(total / read_bw[n] for n in [src_name] + dst_names)
    of_nv, of_sync, of_verify = ideal_copy / t_sync_nv, ideal_readback / t_sync, ideal_verify / t_verify
    ok = of_nv >= DIR_SYNC_TARGET and of_sync >= DIR_SYNC_TARGET and of_verify >= DIR_VERIFY_TARGET

    def mark(x: float, target: float) -> str:
        return f"{x:.3f} of ideal ({'ok' if x >= target else 'BELOW'} target >= {target})"

    rows = [
        ("ceilings (fio, MB/s)", " ".join(f"{n}: read {read_bw[n] / 1e6:.0f}"
                                          + (f" write {write_bw[n] / 1e6:.0f}" if n in write_bw else "") for n in read_bw)),
        (f"dir: {len(files)} files", f"{total / 1e9:.2f} GB ({shards} shards + index, config, tokenizer)"),
        ("dir sync --no-verify to 2", f"{t_sync_nv:7.2f} s  ideal {ideal_copy:6.2f} s  {mark(of_nv, DIR_SYNC_TARGET)}   "
                                      f"rsync -a in turn {t_rsync:6.2f} s  ({t_rsync / t_sync_nv:.2f}x slower)"),
        ("dir sync to 2 + read-back", f"{t_sync:7.2f} s  ideal {ideal_readback:6.2f} s  {mark(of_sync, DIR_SYNC_TARGET)}   "
                                      f"(copy ideal + slowest read-back)   rsync -a in turn (no verify) {t_rsync:6.2f} s"),
        ("dir verify --full of 3", f"{t_verify:7.2f} s  ideal {ideal_verify:6.2f} s  {mark(of_verify, DIR_VERIFY_TARGET)}   "
                                   f"b3sum in turn {t_b3:6.2f} s  ({t_b3 / t_verify:.2f}x slower)"),
    ]
    for k, v in rows:
        print(f"{k:28s} {v}")
    print(json.dumps({"case": "dir", "size": total, "files": len(files), "shards": shards, "read_bw": read_bw,
                      "write_bw": write_bw, "rsync_s": t_rsync, "sync_noverify_s": t_sync_nv, "sync_s": t_sync,
                      "verify_s": t_verify, "b3sum_s": t_b3, "ideal_copy_s": ideal_copy,
                      "ideal_readback_s": ideal_readback, "ideal_verify_s": ideal_verify,
                      "of_ideal": {"sync_noverify": of_nv, "sync": of_sync, "verify": of_verify}, "targets_met": ok}))
    return ok


if __name__ == "__main__":
    main()
