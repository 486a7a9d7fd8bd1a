"""What the OS says the testbed's drives share, and what measuring them together says, side by side.

Three throttled drives (loop devices on image files, docs/iobench.md) and a file in /dev/shm:
`replicas status` on a rig holding them prints the groups read from sysfs before anything is
measured; `iobench run --preset seq` (inside the testbed's group, so the throttles apply) then
measures each drive alone, each group the topology found, and all together. Printed per group:
its GB/s together, the sum of its members alone and the ratio (1.0: the shared thing did not
limit them; below 0.95 the planner treats the group as one shared link).

    python -m bench.topology_bench [--mb 256] [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from bench.testbed import Testbed, drop_caches, wait_writeback, write_random
from core.rig import Member, Rig, save_rig

DRIVES = {"internal": 300, "green": 150, "white": 150}     # MB/s read ceilings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="MiB per file")
    ap.add_argument("--seconds", type=float, default=0.5)
    args = ap.parse_args()
    shm = os.path.join("/dev/shm", f"rt-topology-bench-{os.getpid()}.bin")
    with Testbed(DRIVES, write_mbs=300) as tb, tempfile.TemporaryDirectory(prefix="rt-topology-rig-") as rig:
        try:
            paths = [os.path.join(tb.mount(n), "model.bin") for n in DRIVES]
            write_random(paths + [shm], args.mb << 20, seed=1)
            wait_writeback()
            save_rig(Rig(root=rig, model=Member(paths[0], "internal", "primary"),
                         replicas=tuple(Member(p, n, "replica") for p, n in zip(paths[1:], list(DRIVES)[1:]))
                         + (Member(shm, "shm", "replica"),)))
            st = subprocess.run([sys.executable, "-m", "replicas.cli", "status", "--rig", rig],
                                capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
            print("== replicas status (topology lines) ==")
            for line in st.stdout.splitlines():
                if " share " in line or "no block device" in line or "no two drives" in line:
                    print(line)
            doc = json.loads(subprocess.run([sys.executable, "-m", "replicas.cli", "status", "--rig", rig, "--json"],
                                            capture_output=True, text=True).stdout)
            for d in doc["topology"]["drives"]:
                print(f"  {d['name']:<9} {' <- '.join(x['kind'] + ' ' + x['name'] for x in d['links']) or d['note']}")
            for m in doc["members"]:
                print(f"  {m['name']:<9} devno {m['devno'] or '-':<6} fs_uuid {m['fs_uuid'] or '-'} serial {m['serial'] or '-'}"
                      f" key {m['drive_key']}")
            drop_caches()
            r = tb.run([sys.executable, "-m", "iobench.cli", "run", *paths, shm, "--preset", "seq", "--lanes", "8",
                        "--seconds", str(args.seconds), "--repeat", "2", "--no-save", "--json", "--quiet"],
                       capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"iobench run failed: {r.stderr.strip()}")
            res = json.loads(r.stdout)
        finally:
            if os.path.exists(shm):
                os.unlink(shm)
    alone = {d["name"]: d["presets"]["seq"]["bw_bytes"] for d in res["drives"]}
    print("== iobench run --preset seq (throttled; GB/s decimal) ==")
    print("  alone: " + "  ".join(f"{n} {bw / 1e9:.3f}" for n, bw in alone.items()))
    print(f"  topology groups measured: {res['settings']['topology_groups']}")
    for g in res["groups"] + res["together"]:
        s = sum(alone[m] for m in g["drives"])
        print(f"  {g['name']:<10} {','.join(g['drives']):<28} together {g['bw_bytes'] / 1e9:.3f}  "
              f"sum alone {s / 1e9:.3f}  ratio {g['bw_bytes'] / s:.3f}")


if __name__ == "__main__":
    main()
