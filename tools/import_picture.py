"""Draw vecmerge's import picture from the code: which package imports which (`make readme` pastes it).

The picture is computed by grimp (import-linter's own graph), one node per top-level package or root
module, one arrow per package imported; `python tools/import_picture.py` prints it, `--paste` writes it
between the import-picture markers of docs/ARCHITECTURE.md. tests/contracts/test_architecture_picture.py
checks that the pasted picture is the code's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
START, END = "<!-- import-picture:start -->", "<!-- import-picture:end -->"


def node(module: str) -> str:
    """The package (or root module) a module belongs to: ``vecmerge.io.parse`` -> ``io``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def edges() -> dict[str, set[str]]:
    """``{package: packages it imports}`` over vecmerge's run-time imports (TYPE_CHECKING imports left out)."""
    graph = grimp.build_graph("vecmerge", exclude_type_checking_imports=True)
    out: dict[str, set[str]] = {}
    for module in sorted(graph.modules):
        src = node(module)
        out.setdefault(src, set())
        for imported in graph.find_modules_directly_imported_by(module):
            dst = node(imported)
            if imported.startswith("vecmerge.") and dst != src and src != "__init__":
                out[src].add(dst)
    return out


def picture() -> str:
    """The picture as Markdown: one line per package, its imports, packages ordered by how many they import."""
    graph = edges()
    graph.pop("__init__", None)
    lines = ["```text", "package        imports (run time)"]
    for name in sorted(graph, key=lambda n: (-len(graph[n]), n)):
        lines.append(f"{name:<14} {', '.join(sorted(graph[name])) or '-'}")
    lines.append("```")
    return "\n".join(lines)


def paste(text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv: list[str]) -> int:
    text = picture()
    if "--paste" in argv:
        paste(text)
        print(f"updated {DOC}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
