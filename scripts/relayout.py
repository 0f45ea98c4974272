"""Rewrite module names and source paths in FILE... by ``scripts/relayout_map.tsv`` (issue 13's move).

Usage: ``python scripts/relayout.py FILE...`` (prints each file it changed).

What it rewrites, in any text file (Python, Markdown, Makefile, TOML, YAML, shell):

- ``from old.mod import x`` / ``import old.mod`` and every dotted name that starts with an old module
  (``import_module("old.mod")``, ``monkeypatch.setattr("old.mod.NAME", ...)``, ``python -m old.mod``,
  ``old.mod:main`` entry points, prose);
- ``from old.package import module`` where ``old.package.module`` moved (``from collectors import
  inject`` becomes ``from simulator import inject``);
- source paths (``collectors/fleetsim/rates.py``, ``detectors/rules/``) by the map's path rows.

The longest match wins, and a name that already starts with a new module is left alone, so running
it twice changes nothing (``detectors.engine`` became ``detectors.engine.engine``; the new name is
not rewritten again). A bare ``detectors.engine`` outside an import statement is read as the new
package (``resources.files("detectors.engine")``); ``from detectors.engine import DetectorEngine``
and ``"detectors.engine.DetectorEngine"`` are read as the old module. Relative imports (``from .x import y``) are not touched.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

MAP_FILE = Path(__file__).with_name("relayout_map.tsv")

DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
PATHLIKE = re.compile(r"(?<![\w/.-])[A-Za-z_][\w.-]*(?:/[\w.-]+)+/?")
IMPORT = re.compile(r"^(?P<head>[ \t]*import )(?P<mod>[A-Za-z_][\w.]*)", re.MULTILINE)
FROM_IMPORT = re.compile(r"^(?P<indent>[ \t]*)from (?P<mod>[A-Za-z_][\w.]*) import (?P<names>[^()\n#]+?)(?P<tail>[ \t]*(?:#.*)?)$",
                         re.MULTILINE)


def load_map(path: Path = MAP_FILE) -> tuple[dict[str, str], dict[str, str]]:
    """(module map, path map). Path rows are the ones with a ``/``; module rows also give path rows."""
    modules: dict[str, str] = {}
    paths: dict[str, str] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2:
            raise SystemExit(f"{path}:{n}: want 'old<TAB>new', got {line!r}")
        old, new = parts[0].strip(), parts[1].strip()
        if "/" in old:
            paths[old] = new
        else:
            modules[old] = new
    packages = {m for m in modules if any(k.startswith(m + ".") for k in modules)}
    for old, new in modules.items():
        if old in packages:
            paths.setdefault(old.replace(".", "/") + "/", new.replace(".", "/") + "/")
        else:
            new_is_pkg = any(v.startswith(new + ".") for v in modules.values())
            target = new.replace(".", "/") + ("/__init__.py" if new_is_pkg else ".py")
            paths.setdefault(old.replace(".", "/") + ".py", target)
    return modules, paths


def _prefix_len(name: str, keys: set[str] | dict[str, str], sep: str) -> tuple[int, str | None]:
    parts = name.split(sep)
    for i in range(len(parts), 0, -1):
        cand = sep.join(parts[:i])
        if cand in keys:
            return i, cand
    return 0, None


class Relayout:
    def __init__(self, modules: dict[str, str], paths: dict[str, str]):
        self.modules = modules
        self.new_modules = set(modules.values())
        # old modules that are packages in the new layout (detectors/engine.py -> detectors/engine/)
        self.new_packages = {m.rpartition(".")[0] for m in self.new_modules}
        self.paths = paths
        self.new_paths = set(paths.values())

    def module(self, name: str, *, statement: bool = False) -> str:
        """``name`` in the new layout. A bare name that is both an old module and a new package
        (``detectors.engine``) is taken as the new package, except in an import statement."""
        n_old, old = _prefix_len(name, self.modules, ".")
        if old is None:
            return name
        if name == old and name in self.new_packages and not statement:
            return name
        n_new, _ = _prefix_len(name, self.new_modules, ".")
        if n_new >= n_old:
            return name  # already in the new layout
        return self.modules[old] + name[len(old):]

    def path(self, p: str) -> str:
        best = None
        for old in self.paths:
            if (p == old or (old.endswith("/") and p.startswith(old)) or p == old.rstrip("/")) and (
                    best is None or len(old) > len(best)):
                best = old
        if best is None:
            return p
        for new in self.new_paths:
            if len(new) > len(best) and (p == new or (new.endswith("/") and p.startswith(new))):
                return p
        if p == best.rstrip("/"):
            return self.paths[best].rstrip("/")
        return self.paths[best] + p[len(best):]

    def _from_import(self, m: re.Match[str]) -> str:
        mod, names = m.group("mod"), m.group("names")
        items = [x.strip() for x in names.split(",") if x.strip()]
        if all(f"{mod}.{x.partition(' as ')[0].strip()}" in self.new_modules for x in items):
            return m.group(0)  # ``from new.package import module``: already in the new layout
        moved: dict[str, list[str]] = {}
        kept: list[str] = []
        for item in items:
            base, _, alias = item.partition(" as ")
            base = base.strip()
            full = f"{mod}.{base}"
            if full in self.modules and self.module(full) != full:
                new = self.modules[full]
                parent, _, leaf = new.rpartition(".")
                local = alias.strip() or base
                moved.setdefault(parent, []).append(leaf if leaf == local else f"{leaf} as {local}")
            else:
                kept.append(item)
        if not moved:
            return f"{m.group('indent')}from {self.module(mod, statement=True)} import {names}{m.group('tail')}"
        ind, tail = m.group("indent"), m.group("tail")
        lines = []
        if kept:
            lines.append(f"{ind}from {self.module(mod, statement=True)} import {', '.join(kept)}")
        for parent, leaves in moved.items():
            lines.append(f"{ind}from {parent} import {', '.join(leaves)}")
        lines[0] += tail
        return "\n".join(lines)

    def text(self, src: str) -> str:
        done: list[str] = []  # rewritten ``from`` lines, kept out of the dotted-name pass

        def stash_text(text: str) -> str:
            done.append(text)
            return f"\x00{len(done) - 1}\x00"

        def stash(m: re.Match[str]) -> str:
            return stash_text(self._from_import(m))

        src = FROM_IMPORT.sub(stash, src)
        src = IMPORT.sub(lambda m: stash_text(m.group("head") + self.module(m.group("mod"), statement=True)), src)
        src = DOTTED.sub(lambda m: self.module(m.group(0)), src)
        src = PATHLIKE.sub(lambda m: self.path(m.group(0)), src)
        return re.sub("\x00(\\d+)\x00", lambda m: done[int(m.group(1))], src)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    r = Relayout(*load_map())
    for name in argv:
        p = Path(name)
        if not p.is_file():
            continue
        try:
            src = p.read_text()
        except UnicodeDecodeError:
            continue
        out = r.text(src)
        if out != src:
            p.write_text(out)
            print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
