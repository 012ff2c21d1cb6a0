"""A read-only FUSE passthrough that sleeps a set latency in every open and read: network storage
(NFS, Lustre) in miniature, for benchmarks and the slow-lane test of the coalescing reader.

Every ``open`` and every ``read`` the kernel sends waits ``--latency-ms`` before it is served from
the backing directory; everything else (lookups, attributes, directory listings) is free. Reads are
served by many threads at once (libfuse's multi-threaded loop), so concurrent requests overlap
their latency as they would on a network file system with many RPCs in flight. Needs
``/dev/fuse``, root (or fusermount) and the fusepy binding over libfuse 2:

    apt-get install -y libfuse2 && pip install fusepy==3.0.1

    python bench/latency_fs.py BACKING_DIR MOUNTPOINT --latency-ms 2     # foreground

From Python, :func:`mounted` mounts it in a child process for the length of a ``with`` block.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import subprocess
import sys
import time
from pathlib import Path

INSTALL = "apt-get install -y libfuse2 && pip install fusepy==3.0.1"


def fuse_available() -> str | None:
    """None when a latency mount can be made here, else why not (with the install command)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    try:
        import fuse  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"the fusepy binding is not usable ({exc}): {INSTALL}"
    return None


def make_ops(backing: str, latency_s: float):
    from fuse import FuseOSError, Operations

    class LatencyPassthrough(Operations):
        """Read-only passthrough; ``open`` and ``read`` sleep ``latency_s`` first."""

        def __init__(self) -> None:
            self.root = os.path.realpath(backing)

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def getattr(self, path, fh=None):
            try:
                st = os.lstat(self._full(path))
            except OSError as exc:
                raise FuseOSError(exc.errno) from None
            return {
                k: getattr(st, k)
                for k in (
                    "st_atime",
                    "st_ctime",
                    "st_gid",
                    "st_mode",
                    "st_mtime",
                    "st_nlink",
                    "st_size",
                    "st_uid",
                )
            }

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._full(path))]

        def readlink(self, path):
            return os.readlink(self._full(path))

        def statfs(self, path):
            st = os.statvfs(self._full(path))
            return {
                k: getattr(st, k)
                for k in (
                    "f_bavail",
                    "f_bfree",
                    "f_blocks",
                    "f_bsize",
                    "f_favail",
                    "f_ffree",
                    "f_files",
                    "f_flag",
                    "f_frsize",
                    "f_namemax",
                )
            }

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR):
                raise FuseOSError(errno.EROFS)
            time.sleep(latency_s)
            try:
                return os.open(self._full(path), os.O_RDONLY)
            except OSError as exc:
                raise FuseOSError(exc.errno) from None

        def read(self, path, size, offset, fh):
            time.sleep(latency_s)
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)
            return 0

    return LatencyPassthrough()


def serve(backing: str, mountpoint: str, latency_ms: float) -> None:
    import ctypes

    from fuse import FUSE

    latency_s = latency_ms / 1000.0

    class _FUSE(FUSE):
        """fusepy with ``read`` served by one ``preadv`` straight into the kernel's buffer
        (fusepy's own returns bytes, then copies them): the server costs the least CPU it can,
        so what a reader sees is the latency rather than this process."""

        def read(self, path, buf, size, offset, fip):
            time.sleep(latency_s)
            out = (ctypes.c_char * size).from_address(ctypes.cast(buf, ctypes.c_void_p).value)
            try:
                return os.preadv(fip.contents.fh, [out], offset)
            except OSError as exc:
                return -exc.errno

    # foreground, multi-threaded; the kernel's page cache is kept (as an NFS client's is): a
    # bench drops it (posix_fadvise DONTNEED) before each cold pass. libfuse 2 caps a request
    # at 128 KiB whatever max_read says.
    _FUSE(
        make_ops(backing, latency_s),
        mountpoint,
        foreground=True,
        nothreads=False,
        ro=True,
        max_read=1 << 20,
        max_readahead=1 << 20,
    )


def unmount(mountpoint: str) -> None:
    for cmd in (["fusermount", "-u", "-z", mountpoint], ["umount", "-l", mountpoint]):
        try:
            if subprocess.run(cmd, capture_output=True).returncode == 0:
                return
        except FileNotFoundError:
            continue


@contextlib.contextmanager
def mounted(backing: str | Path, mountpoint: str | Path, latency_ms: float, timeout: float = 20.0):
    """Mount ``backing`` at ``mountpoint`` with ``latency_ms`` per open and read (a child
    process); yields the mountpoint; unmounts and stops the child on exit."""
    why = fuse_available()
    if why is not None:
        raise RuntimeError(why)
    mountpoint = Path(mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            str(backing),
            str(mountpoint),
            "--latency-ms",
            str(latency_ms),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + timeout
        while not os.path.ismount(mountpoint):
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"latency_fs exited ({proc.returncode}): {err.strip()[-500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"latency_fs did not mount {mountpoint} in {timeout} s")
            time.sleep(0.05)
        yield mountpoint
    finally:
        unmount(str(mountpoint))
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("backing")
    p.add_argument("mountpoint")
    p.add_argument("--latency-ms", type=float, default=2.0)
    a = p.parse_args(argv)
    why = fuse_available()
    if why is not None:
        raise SystemExit(why)
    serve(a.backing, a.mountpoint, a.latency_ms)


if __name__ == "__main__":
    main()
