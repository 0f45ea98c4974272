"""Parsed data files kept between processes, so a hand-run command does not parse YAML again.

``fleethealth diagnose FILE`` once spent a third of its start-up importing PyYAML and reading the
rule files (issue 18). :func:`cached` returns what ``build()`` returned the last time for the same
sources, read from a pickle under the user's cache folder; any change to a source (its size,
modification time or content: a CRC-32 of the bytes, read each time) or to the fleethealth version
builds it again. The sources named are the data files *and* the modules whose code turns them into
values, so a new parser never reads an old result.

Where: ``$FLEETHEALTH_CACHE_DIR``, else ``$XDG_CACHE_HOME/fleethealth``, else
``~/.cache/fleethealth``; ``FLEETHEALTH_CACHE_DIR=off`` (or empty) turns the cache off. The cache is
an optimisation only: a folder that cannot be created or written, a file that is not ours (another
owner, writable by group or others) or does not unpickle is ignored, and the value is built as if
there were no cache. Files are written to a temporary name and renamed into place, so processes
running side by side never read half a file.
"""

from __future__ import annotations

import os
import pickle
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from fleethealth import __version__

T = TypeVar("T")
FORMAT = 1  # bump when what is stored changes shape


def cache_dir() -> Path | None:
    """The cache folder, or None when the cache is off."""
    env = os.environ.get("FLEETHEALTH_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "no") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleethealth"


def signature(sources: Sequence[Path]) -> tuple[object, ...]:
    """What must be unchanged for a cached value to stand: per source its path, size, mtime and CRC-32.
    Raises OSError when a source cannot be read (the caller's ``build`` reports it properly)."""
    out: list[object] = [FORMAT, __version__, sys.version_info[:2]]
    for p in sources:
        st = os.stat(p)
        with open(p, "rb") as fh:
            crc = zlib.crc32(fh.read())
        out.append((str(p), st.st_size, st.st_mtime_ns, crc))
    return tuple(out)


def _ours(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def cached(kind: str, sources: Sequence[Path], build: Callable[[], T]) -> T:
    """``build()``, or the value it gave last time for these very ``sources``. ``kind`` names the
    value (one file per kind and set of sources); only plain data and the project's own classes are
    stored, and only values ``build`` returned without raising."""
    folder = cache_dir()
    if folder is None:
        return build()
    try:
        sig = signature(sources)
    except OSError:
        return build()
    name = f"{kind}-{zlib.crc32(repr([str(p) for p in sources]).encode()):08x}.pickle"
    path = os.path.join(folder, name)
    if _ours(path):
        try:
            with open(path, "rb") as fh:
                stored_sig, value = pickle.load(fh)
            if stored_sig == sig:
                return value  # type: ignore[no-any-return]
        except Exception:  # a damaged cache file, or one an older build wrote: build afresh
            pass
    value = build()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            pickle.dump((sig, value), fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return value
