"""A testbed drive modelled by its service time (`iobench testbed up --pacing service`): a FUSE
view of one image file whose requests are served one at a time, each ending `bytes / rate` after
it started, and starting when it arrives or when the one before it ends, whichever is later. A
drive left idle banks nothing, as a real drive, whose time goes into serving, banks nothing;
blk-throttle's byte budget lets an idle drive's next read through at once (docs/iobench.md, "What
a throttled drive is not").

    python -m iobench.servedrive IMAGE MOUNTDIR CONTROL

The testbed attaches a loop device (direct I/O) to MOUNTDIR/<IMAGE's name> and builds the drive's
ext4 on it, so everything above the loop device (page cache, O_DIRECT, the RAM budget) is as on a
throttled drive. CONTROL is a JSON document {"read_mbs": R, "write_mbs": W} (MB/s, 10**6 B/s;
0: no limit), read at start and again whenever it changes (`set_read_limit`: a drive that slows
or recovers mid-run; the testbed writes it through a temporary name and a rename, so every write
is a new inode, seen at the next request). Requests are taken in the order the kernel sends them,
one at a time (single-threaded: a queue of depth one; the kernel hands a read over in requests of
about 512 KiB: 128 MiB read through ext4 came as 311 requests with O_DIRECT and 261 buffered), so
the FUSE round trip through Python is the drive's latency: a read alone takes 0.6-1 ms more than
its bytes at the rate. Runs until MOUNTDIR is unmounted (the testbed's `down`); prints what it
served to stderr then. Needs libfuse3 (apt fuse3) and the mfusepy package
(`pip install -e '.[bench]'`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time

MODULE = "iobench.servedrive"


TURNAROUND_S = 0.002       # the daemon's and the kernel's own time between two requests, not charged


def done_at(busy_until: float, now: float, nbytes: int, rate: float, turnaround: float = TURNAROUND_S) -> float:
    """When a request of `nbytes` taken up at `now` ends on a drive busy until `busy_until` that
    serves `rate` bytes a second (0: no limit). A request taken up within `turnaround` of the
    drive's last end was waiting behind it (the daemon was handing back the last one, a FUSE
    round trip and Python, and the kernel hands over a read's requests with gaps of up to a
    millisecond or two: with 0.5 ms, a 2.5 MB read at 60 MB/s took 45 ms, not 41.6), so it
    starts at that end; later, the drive was idle and it starts now. So requests back to back go
    at the rate (fio: 59.9 MB/s at 60), and an idle drive banks at most `turnaround`, where
    blk-throttle banks a 100 ms slice."""
    start = busy_until if busy_until <= now <= busy_until + turnaround else max(now, busy_until)
    return start + (nbytes / rate if rate > 0 else 0.0)


def read_control(path: str) -> tuple[float, float]:
    """(read, write) rates in bytes/s from a control document (0: no limit)."""
    with open(path) as f:
        doc = json.load(f)
    return float(doc["read_mbs"]) * 1e6, float(doc["write_mbs"]) * 1e6


def control_doc(read_mbs: float, write_mbs: float) -> dict:
    return {"read_mbs": read_mbs, "write_mbs": write_mbs}


def serve(image: str, mountdir: str, control: str) -> int:
    """Mount the paced view of `image` on `mountdir` and serve it until unmounted."""
    try:
        import mfusepy as fuse
    except (ImportError, OSError) as e:        # OSError: mfusepy found no libfuse
        sys.stderr.write(f"servedrive: needs libfuse3 (apt install fuse3) and the mfusepy package "
                         f"(pip install -e '.[bench]'): {e}\n")
        return 2

    class PacedImage(fuse.Operations):
        use_ns = True

        def __init__(self) -> None:
            self.fd = os.open(image, os.O_RDWR)
            self.name = "/" + os.path.basename(image)
            self.busy_until = 0.0
            self.control_seen = (0, 0)      # (inode, mtime) of the rates read: each write is a new file
            self.read_rate = self.write_rate = 0.0
            self.served = {"read": [0, 0], "write": [0, 0]}      # requests, bytes

        def _rates(self) -> tuple[float, float]:
            st = os.stat(control)
            if (st.st_ino, st.st_mtime_ns) != self.control_seen:
                self.read_rate, self.write_rate = read_control(control)
                self.control_seen = (st.st_ino, st.st_mtime_ns)
            return self.read_rate, self.write_rate

        def _pace(self, t0: float, nbytes: int, rate: float, kind: str) -> None:
            self.busy_until = done_at(self.busy_until, t0, nbytes, rate)
            wait = self.busy_until - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.served[kind][0] += 1
            self.served[kind][1] += nbytes

        def getattr(self, path, fh=None):
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path != self.name:
                raise fuse.FuseOSError(errno.ENOENT)
            st = os.fstat(self.fd)
            return {"st_mode": stat.S_IFREG | 0o600, "st_size": st.st_size, "st_nlink": 1, "st_mtime": st.st_mtime,
                    "st_atime": st.st_atime, "st_ctime": st.st_ctime}

        def readdir(self, path, fh):
            return [".", "..", self.name[1:]]

        def open(self, path, flags):
            if path != self.name:
                raise fuse.FuseOSError(errno.ENOENT)
            return 0

        def read(self, path, size, offset, fh):
            t0 = time.monotonic()
            data = os.pread(self.fd, size, offset)
            self._pace(t0, len(data), self._rates()[0], "read")
            return data

        def write(self, path, data, offset, fh):
            t0 = time.monotonic()
            n = os.pwrite(self.fd, data, offset)
            self._pace(t0, n, self._rates()[1], "write")
            return n

        def fsync(self, path, datasync, fh):
            return 0            # a scratch drive: its bytes live in the image until the testbed goes

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            return 0

        def destroy(self, path):
            r, w = self.served["read"], self.served["write"]
            sys.stderr.write(f"servedrive: {image}: served {r[0]} reads ({r[1]} bytes), {w[0]} writes ({w[1]} bytes)\n")
            sys.stderr.flush()

    fuse.FUSE(PacedImage(), mountdir, foreground=True, nothreads=True, direct_io=True, allow_other=True)
    return 0


def main() -> None:
    if len(sys.argv) != 4:
        sys.stderr.write("usage: python -m iobench.servedrive IMAGE MOUNTDIR CONTROL\n")
        sys.exit(2)
    sys.exit(serve(*sys.argv[1:]))


if __name__ == "__main__":
    main()
