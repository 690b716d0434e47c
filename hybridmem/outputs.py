"""Output files that never destroy the user's data (ground layer: imports only ``errors``).

Every file the tools write goes through :func:`atomic_output`::

    OUT.parquet  (old contents, untouched until the new file is complete)
    .OUT.parquet.<random>.tmp.parquet   <- the writer writes here, in OUT's own directory
        |  success: fsync, os.replace(tmp, OUT)   (atomic on POSIX: readers see old or new)
        |  failure: tmp removed, OUT as it was (a failed write never deletes an existing OUT)

and refuses an output that is one of the command's inputs (same resolved path, or the same
inode through a link), so ``trace export T --parquet T`` or a query's ``COPY ... TO 'T'`` can
never overwrite the trace being read, and an existing output that is not a regular file (a
device, a FIFO, a symbolic link: the rename would replace the node itself). The temporary
keeps OUT's suffix, so libraries that pick a format from the name (matplotlib, Parquet writers)
write the right one.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hybridmem.errors import HybridMemError

PathLike = str | os.PathLike[str]


class OutputError(HybridMemError):
    """An output path that cannot be written safely (missing directory, an input, a folder)."""


def same_file(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name one file: equal resolved paths, or one inode."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.resolve() == pb.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return pa.exists() and pb.exists() and os.path.samefile(pa, pb)
    except OSError:
        return False


def check_output(out: PathLike, inputs: Iterable[PathLike] = (), what: str = "output") -> Path:
    """``out`` as a Path, after refusing an empty name, a folder, a missing parent folder and
    any of ``inputs``. Raises :class:`OutputError` (one line, the CLI's exit 2)."""
    raw = os.fspath(out)
    if not str(raw).strip():
        raise OutputError(f"{what}: an empty path")
    p = Path(raw)
    for src in inputs:
        if same_file(p, src):
            raise OutputError(f"{what} {raw!r} is an input of this command; refusing to "
                              "overwrite it")
    if p.is_dir():
        raise OutputError(f"{what} {raw!r} is a directory")
    try:
        mode = p.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except (OSError, ValueError) as exc:
        raise OutputError(f"{what} {raw!r}: {exc}") from None
    if mode is not None and not stat.S_ISREG(mode):
        # the rename would replace the node itself: a device (/dev/stdout as root), a FIFO
        # another process reads, or a link the user meant to write through
        kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        raise OutputError(f"{what} {raw!r} is {kind}; name a regular file")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{what} {raw!r}: no such directory {str(parent)!r}")
    return p


def temp_path(out: Path) -> Path:
    """A fresh temporary name beside ``out``, with ``out``'s suffix."""
    return out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp{out.suffix}")


@contextmanager
def atomic_output(out: PathLike, inputs: Iterable[PathLike] = (),
                  what: str = "output") -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces ``out`` atomically, on any
    exception it is removed and ``out`` is left as it was."""
    target = check_output(out, inputs, what)
    tmp = temp_path(target)
    try:
        yield tmp
        if not tmp.exists():
            raise OutputError(f"{what} {os.fspath(out)!r}: the writer produced no file")
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def write_bytes_atomic(out: PathLike, data: bytes, inputs: Iterable[PathLike] = (),
                       what: str = "output") -> None:
    with atomic_output(out, inputs, what) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(out: PathLike, text: str, inputs: Iterable[PathLike] = (),
                      what: str = "output") -> None:
    write_bytes_atomic(out, text.encode("utf-8"), inputs, what)
