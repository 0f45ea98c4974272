"""Whole-file writes a reader never sees half of: a temp file in the same folder, then ``os.replace``.

The one helper for files that other processes read while we write them (the HTML report, Grafana's
dashboard files, model archives, the parsed-data cache).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` in one step: the old content or the new, never a part.

    ``mode`` is the file's permission bits (``mkstemp`` makes 0600). Text is written as UTF-8 with
    ``\\n`` line ends. On any failure the temp file is removed and the error raised.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
