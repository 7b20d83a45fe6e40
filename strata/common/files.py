"""Durable file writes shared by every on-disk format (checkpoints, snapshots, markers)."""

from __future__ import annotations

import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """fsync a directory so renames and creations in it survive a crash (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` all at once: write ``<path>.tmp``, fsync, rename, fsync the dir.

    A crash leaves either the old file or the new one, never a mix; a failed write removes the
    tmp file and re-raises.
    """
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    if sync:
        fsync_dir(path.parent)


def descriptor_limit() -> int:
    """This process's soft open-file limit (2**20 when unlimited)."""
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_descriptor_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; the soft limit now in force.

    A broker holds descriptors for its segments and index maps; the soft limit a shell hands
    down (often 1024) can be far below what the hard limit allows."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    return descriptor_limit()
