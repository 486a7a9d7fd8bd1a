"""A drive modelled by its service time: a read-only FUSE view of a folder that serves one read at
a time, each taking `latency + bytes / rate` (a queue of depth one, like a drive whose bandwidth
is spent serving, never banked while idle).

    python -m bench.service_time_fs SOURCE MOUNTPOINT --mbs 60 [--latency-ms 0.1]

The testbed's throttle (cgroup blkio) caps bytes per time slice, so a drive left idle has credit
to dispatch a read at once; this device has none: a read waits for the one before it, then for
its own transfer. One process per mount; requests are taken in the order the kernel sends them
(single-threaded). Needs libfuse3 (`fuse3`) and the `mfusepy` package; unmount with
`fusermount3 -u MOUNTPOINT` (or end the process). MB = 10**6 bytes.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import sys
import time

from iobench.servedrive import done_at

try:
    import mfusepy as fuse
except ImportError:     # the bench that mounts it says so in one line
    fuse = None


class ServiceTimeFS(fuse.Operations if fuse else object):
    use_ns = True

    def __init__(self, source: str, rate: float, latency: float):
        self.source, self.rate, self.latency = source, rate, latency
        self.busy_until = 0.0
        self.reads = 0
        self.bytes = 0

    def _path(self, path: str) -> str:
        return os.path.join(self.source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        st = os.lstat(self._path(path))
        if stat.S_ISDIR(st.st_mode):
            mode = st.st_mode & ~0o222
        else:
            mode = stat.S_IFREG | 0o444
        return {"st_mode": mode, "st_size": st.st_size, "st_nlink": st.st_nlink, "st_mtime": st.st_mtime,
                "st_atime": st.st_atime, "st_ctime": st.st_ctime, "st_uid": st.st_uid, "st_gid": st.st_gid}

    def readdir(self, path, fh):
        return [".", "..", *sorted(os.listdir(self._path(path)))]

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        return os.open(self._path(path), os.O_RDONLY)

    def read(self, path, size, offset, fh):
        now = time.monotonic()
        data = os.pread(fh, size, offset)
        # the testbed's paced drive's rule (iobench.servedrive.done_at), with no turnaround: a read
        # starts when the one before it ended or now, whichever is later; plus this drive's latency
        self.busy_until = done_at(self.busy_until, now, len(data), self.rate, turnaround=0.0) + self.latency
        delay = self.busy_until - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        self.reads += 1
        self.bytes += len(data)
        return data

    def destroy(self, path):
        print(f"service_time_fs: {self.reads} reads, {self.bytes} bytes", file=sys.stderr, flush=True)

    def release(self, path, fh):
        os.close(fh)
        return 0

    def statfs(self, path):
        s = os.statvfs(self.source)
        return {k: getattr(s, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                                           "f_ffree", "f_namemax")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("mountpoint")
    ap.add_argument("--mbs", type=float, required=True, help="Transfer rate, MB/s.")
    ap.add_argument("--latency-ms", type=float, default=0.1, help="Fixed time per read, ms.")
    a = ap.parse_args()
    if fuse is None:
        print("service_time_fs: needs the mfusepy package (pip install -e '.[bench]') and libfuse3 (apt fuse3)", file=sys.stderr)
        return 2
    fuse.FUSE(ServiceTimeFS(a.source, a.mbs * 1e6, a.latency_ms / 1e3), a.mountpoint, foreground=True,
              nothreads=True, ro=True, allow_other=True, kernel_cache=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
