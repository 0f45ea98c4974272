"""The indented ``Key : Value`` tree that ``nvidia-smi -q`` prints, as plain nodes (pure)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from parsers.base import ParseError

FORMAT = "nvidia-smi-q"


@dataclass(slots=True)
class Node:
    key: str
    value: str | None  # None for a section header
    lineno: int
    raw: str
    indent: int
    colon: int = -1  # column of " : " in the raw line; -1 for headers
    padded: bool = False  # the key was padded with spaces up to the colon column
    children: list[Node] = field(default_factory=list)

    def child(self, *path: str) -> Node | None:
        node: Node | None = self
        for name in path:
            if node is None:
                return None
            want = name.lower()
            node = next((c for c in node.children if c.key.lower() == want), None)
        return node

    def get(self, *path: str) -> str | None:
        n = self.child(*path)
        return n.value if n is not None else None

    def all(self, name: str) -> list[Node]:
        want = name.lower()
        return [c for c in self.children if c.key.lower() == want]


def parse_tree(text: str) -> Node:
    """Build the tree; raise :class:`ParseError` for a line whose layout no nvidia-smi prints."""
    root = Node("<root>", None, 0, "", -1)
    stack: list[Node] = [root]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not line.strip() or line.lstrip().startswith("====="):
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise ParseError(FORMAT, "tab in indentation", lineno)
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        pos = line.find(" : ")
        if pos < 0 and line.endswith(" :"):
            pos = len(line) - 2
        if pos >= 0:
            key = line[:pos].strip()
            value: str | None = line[pos + 3:].strip() if pos + 3 <= len(line) else ""
            padded = line[:pos].endswith("  ")
        else:
            key, value, padded = body, None, False
        if not key:
            raise ParseError(FORMAT, f"a value without a field name: {body[:80]!r}", lineno)
        node = Node(key, value, lineno, raw, indent, pos, padded)
        while stack[-1].indent >= indent:
            stack.pop()
        stack[-1].children.append(node)
        stack.append(node)
    _check_alignment(root)
    return root


def _check_alignment(node: Node) -> None:
    """nvidia-smi pads every field name of one section to the same column. A padded name that
    stops at another column was not printed by nvidia-smi (an edited or corrupted capture)."""
    fields = [c for c in node.children if c.value is not None]
    if len(fields) >= 2:
        dominant, _ = Counter(c.colon for c in fields).most_common(1)[0]
        for c in fields:
            if c.colon != dominant and c.padded:
                raise ParseError(
                    FORMAT,
                    f"field {c.key!r} is aligned to column {c.colon} but its section "
                    f"{node.key!r} uses column {dominant}: not nvidia-smi output",
                    c.lineno,
                )
    for c in node.children:
        _check_alignment(c)
