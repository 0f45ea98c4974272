"""Regular expressions compiled on first use.

``fleethealth diagnose FILE`` compiled ~200 patterns at start-up, most of them for line shapes and
rules the file never reaches (a kernel log with one Xid does not need the MCE, GSP or NVSwitch
patterns); compiling them cost more than reading the file (issue 18). :func:`lazy` returns an
object with the :class:`re.Pattern` methods the code uses, which compiles its pattern the first
time one is called (``re`` keeps it cached for the process) and then forwards to it. What a pattern
matches is unchanged; only *when* it is compiled moves. Patterns written by users (rule files) are
still checked when the file is read, so a bad one fails start-up with file and line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LazyPattern", "lazy"]


class LazyPattern:
    __slots__ = ("pattern", "flags", "_rx", "_home")

    def __init__(self, pattern: str, flags: int = 0, home: dict[str, Any] | None = None) -> None:
        self.pattern = pattern
        self.flags = flags
        self._rx: re.Pattern[str] | None = None
        self._home = home

    @property
    def compiled(self) -> re.Pattern[str]:
        rx = self._rx
        if rx is None:
            rx = self._rx = re.compile(self.pattern, self.flags)
            home, self._home = self._home, None
            if home is not None:
                # a module-level pattern: its module's global now names the compiled pattern itself,
                # so the functions that read it pay nothing for the laziness after the first use
                for name in [k for k, v in home.items() if v is self]:
                    home[name] = rx
        return rx

    def match(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return (self._rx or self.compiled).match(string, pos, endpos)

    def search(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return (self._rx or self.compiled).search(string, pos, endpos)

    def fullmatch(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> re.Match[str] | None:
        return (self._rx or self.compiled).fullmatch(string, pos, endpos)

    def finditer(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> Iterator[re.Match[str]]:
        return (self._rx or self.compiled).finditer(string, pos, endpos)

    def findall(self, string: str, pos: int = 0, endpos: int = sys.maxsize) -> list[Any]:
        return (self._rx or self.compiled).findall(string, pos, endpos)

    def sub(self, repl: str | Callable[[re.Match[str]], str], string: str, count: int = 0) -> str:
        return (self._rx or self.compiled).sub(repl, string, count)

    def split(self, string: str, maxsplit: int = 0) -> list[str | Any]:
        return (self._rx or self.compiled).split(string, maxsplit)

    @property
    def groupindex(self) -> Any:
        return self.compiled.groupindex

    def __repr__(self) -> str:
        return f"lazy({self.pattern!r}, {self.flags})"


def lazy(pattern: str, flags: int | re.RegexFlag = 0) -> LazyPattern:
    """A pattern compiled the first time it is used (``re.compile``'s signature). Assigned to a
    module-level name, that name is rebound to the compiled :class:`re.Pattern` on first use."""
    return LazyPattern(pattern, int(flags), sys._getframe(1).f_globals)
