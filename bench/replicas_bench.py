"""replicas on throttled drives, side by side with the yardsticks, from one run.

Builds 3 throttled drives (bench/testbed.py: root, Linux; exits 2 where there is no testbed),
writes a random model file on the first, then times, each from a cold page cache:

  sync    `replicas sync` to 2 destinations (with and without the cold read-back) vs the ideal
          (max of the source's read time and the slowest destination's write time, from fio
          ceilings measured in the same run) and vs `rsync --fsync` to each destination in turn
  verify  `replicas verify --full` of the 3 members vs the ideal (slowest drive's size/ceiling)
          and vs `b3sum` over the same files one after another

Targets: verify within 1.1x of ideal; sync within 1.2x of ideal.

  python bench/replicas_bench.py [--size 2G] [--read internal:300,green:150,white:150] [--write-mbs 150]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.testbed import Testbed, drop_caches, fio_seq, parse_drives, write_random  # noqa: E402
from core.units import parse_size  # noqa: E402

REPLICAS = os.path.join(os.path.dirname(sys.executable), "replicas")
WARM = [REPLICAS, "verify", "--help"]   # load the tool's code (not the data) after dropping caches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2G")
    ap.add_argument("--read", default="internal:300,green:150,white:150", help="NAME:MB/s read ceilings; the first holds the source")
    ap.add_argument("--write-mbs", type=float, default=150)
    a = ap.parse_args()
    size = parse_size(a.size)
    ceilings = parse_drives(a.read, "--read")
    names = list(ceilings)
    src_name, dst_names = names[0], names[1:3]
    with Testbed(ceilings, write_mbs=a.write_mbs) as tb:
        src = os.path.join(tb.mount(src_name), "model.gguf")
        print(f"testbed: read {a.read} MB/s, write {a.write_mbs:g} MB/s; model {size / 1e9:.2f} GB", flush=True)
        write_random([src], size, seed=1)

        # Ceilings measured in this run, with fio (bw_bytes), on these drives.
        read_bw = {src_name: fio_seq(tb, src, "read", size)}
        write_bw = {}
        for n in dst_names:
            probe = os.path.join(tb.mount(n), "fio-probe")
            write_bw[n] = fio_seq(tb, probe, "write", min(size, 512 << 20))
            read_bw[n] = fio_seq(tb, probe, "read", min(size, 512 << 20))
            os.unlink(probe)

        # rsync to each destination in turn (the usual way), made durable like ours.
        rs_dirs = [os.path.join(tb.mount(n), "rsync") for n in dst_names]
        for d in rs_dirs:
            os.makedirs(d)
        t_rsync = 0.0
        drop_caches()
        for d in rs_dirs:
            t_rsync += tb.timed(["rsync", "--fsync", "--whole-file", src, d + "/"], cold=False)
        for d in rs_dirs:
            shutil.rmtree(d)

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
        ("ceilings (fio, MB/s)", " ".join(f"{n}: read {read_bw[n] / 1e6:.0f}" + (f" write {write_bw[n] / 1e6:.0f}" if n in write_bw else "") for n in read_bw)),
        ("sync --no-verify to 2", f"{t_sync_nv:7.2f} s  ideal {ideal_copy:6.2f} s  ratio {t_sync_nv / ideal_copy:.3f}x (target <= 1.2)   rsync in turn {t_rsync:6.2f} s  ({t_rsync / t_sync_nv:.2f}x slower)"),
        ("sync to 2 + read-back", f"{t_sync:7.2f} s  ideal {ideal_readback:6.2f} s  ratio {t_sync / ideal_readback:.3f}x (copy ideal + slowest read-back)   vs copy-only ideal {t_sync / ideal_copy:.3f}x   rsync in turn (no verify) {t_rsync:6.2f} s"),
        ("verify --full of 3", f"{t_verify:7.2f} s  ideal {ideal_verify:6.2f} s  ratio {t_verify / ideal_verify:.3f}x (target <= 1.1)   b3sum in turn {t_b3:6.2f} s  ({t_b3 / t_verify:.2f}x slower)"),
    ]
    for k, v in rows:
        print(f"{k:24s} {v}")
    print(json.dumps({"size": size, "read_bw": read_bw, "write_bw": write_bw, "rsync_s": t_rsync, "sync_noverify_s": t_sync_nv,
                      "sync_s": t_sync, "verify_s": t_verify, "b3sum_s": t_b3, "ideal_copy_s": ideal_copy,
                      "ideal_readback_s": ideal_readback, "ideal_verify_s": ideal_verify}))


if __name__ == "__main__":
    main()
