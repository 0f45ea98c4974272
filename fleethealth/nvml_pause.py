"""The NVML pause-file protocol between the collector and whatever resets a GPU on its host.

``nvidia-smi -r`` refuses while any NVML client holds the GPU, and the collector is one (it keeps
NVML initialised with an event set registered). While ``PAUSE`` exists the collector frees its event
set and shuts NVML down (``collectors/daemon.py``, ``_pause_check``) and then writes ``PAUSE.released``;
removing ``PAUSE`` resumes NVML at its next poll. :func:`nvml_paused` is the other side: it creates
the pause file, waits for the collector to say it let go, and removes the file afterwards, whatever
happened in between.

Guards (DESIGN.md, the trust boundary): the paths come from the local configuration, never from an
incident; the pause file is created exclusively (a second reset on the same host while one is in
progress is refused, not interleaved); nothing is reset unless the collector confirmed the release
within the deadline; only the pause file this holder created is removed (its token is checked).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

RELEASED_SUFFIX = ".released"


class NvmlPauseError(RuntimeError):
    """The pause could not be taken: another reset holds it, or the collector did not let go."""


def released_marker(pause_file: str | os.PathLike[str]) -> Path:
    return Path(str(pause_file) + RELEASED_SUFFIX)


@contextmanager
def nvml_paused(pause_file: str | os.PathLike[str], *, wait_s: float = 60.0, owner: str = "",
                poll_s: float = 0.2, sleep: Callable[[float], None] = time.sleep) -> Iterator[Path]:
    """Hold NVML released on this host for the duration of the block.

    Raises :class:`NvmlPauseError` before the block runs when the pause file already exists (another
    holder), cannot be created, or the collector's released marker does not appear within
    ``wait_s``; the pause file is removed in every case once this call created it."""
    pause = Path(pause_file)
    marker = released_marker(pause)
    token = f"{owner or 'fleethealth'} {os.getpid()} {secrets.token_hex(8)}\n"
    try:
        fd = os.open(pause, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise NvmlPauseError(f"{pause} exists: another GPU reset holds NVML paused on this host "
                             f"({_read(pause) or 'holder unknown'}); not starting a second one") from None
    except OSError as exc:
        raise NvmlPauseError(f"cannot create {pause}: {exc}") from None
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        # a marker left from an earlier pause the collector has not cleared yet says nothing about
        # this one: drop it, the collector writes it again once it has let go (release is idempotent)
        marker.unlink(missing_ok=True)
        deadline = time.monotonic() + wait_s
        while not marker.exists():
            if time.monotonic() >= deadline:
                raise NvmlPauseError(f"the collector did not release NVML within {wait_s:g}s ({marker} not written): "
                                     "no reset while a client may still hold the GPU")
            sleep(poll_s)
        yield pause
    finally:
        if _read(pause) == token.strip():
            pause.unlink(missing_ok=True)


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")[:200].strip()
    except OSError:
        return ""
