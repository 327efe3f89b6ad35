"""The layers, checked: imports run one way, no module imports itself round a circle, and no
module grows past 450 lines without saying why.

    gateway.kernel   events, bus, store, config, clock, ... : imports nothing else of ours
    workspace        the files on disk                      : kernel
    channels         one adapter per platform               : kernel
    agent            context, tool loop, tools              : kernel, workspace
    parley           the plugin authors' kit (testing)      : kernel, channels
    gateway          the composition root (app, cli, ...)   : anything

Every import counts, including those under ``TYPE_CHECKING`` and inside functions: a circle
drawn only for the type checker is still a circle a reader has to untangle.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "channels", "agent", "workspace", "parley")
ALLOWED: dict[str, set[str]] = {
    "kernel": {"kernel"},
    "workspace": {"kernel", "workspace"},
    "channels": {"kernel", "channels"},
    "agent": {"kernel", "workspace", "agent"},
    "parley": {"kernel", "channels", "parley"},
    "root": {"kernel", "workspace", "channels", "agent", "root"},
}
MAX_LINES = 450
SIZE_NOTE = "Longer than 450 lines:"
"""A module over MAX_LINES says why in a line near its top that starts with this."""


def layer(module: str) -> str:
    if module == "gateway.kernel" or module.startswith("gateway.kernel."):
        return "kernel"
    top = module.split(".")[0]
    return "root" if top == "gateway" else top


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py")
                  if ".venv" not in p.parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The modules of ours that ``path`` imports (the longest known prefix of each name)."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            if parts and ".".join(parts) != this:
                found.add(".".join(parts))
    return found


def import_graph() -> dict[str, set[str]]:
    files = source_files(*PACKAGES)
    modules = {module_name(p) for p in files}
    graph: dict[str, set[str]] = defaultdict(set)
    for path in files:
        graph[module_name(path)] |= imports_of(path, modules)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_imports_run_one_way() -> None:
    graph = import_graph()
    wrong = sorted(f"{src} ({layer(src)}) imports {dst} ({layer(dst)})"
                   for src, targets in graph.items() for dst in targets
                   if layer(dst) not in ALLOWED[layer(src)])
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_modules_stay_small_or_say_why() -> None:
    too_long = []
    for path in source_files(*PACKAGES, "tests", "bench"):
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_LINES and not any(SIZE_NOTE in line for line in lines[:20]):
            too_long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
    assert not too_long, (f"modules over {MAX_LINES} lines without a '{SIZE_NOTE}' note at "
                          "the top:\n" + "\n".join(too_long))


def test_the_rule_sees_a_wrong_edge_and_a_circle() -> None:
    """The checks themselves: they would have caught what they are for."""
    assert layer("gateway.kernel.events") == "kernel" and layer("gateway.app") == "root"
    assert "channels" not in ALLOWED["agent"] and "agent" not in ALLOWED["channels"]
    assert layer("parley.testing.contract") == "parley" and "agent" not in ALLOWED["parley"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
