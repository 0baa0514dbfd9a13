"""The tree shows the design: no import cycle in src/, Keras-free readers, README's map is true."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = SRC / "tpulm"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> tpulm modules it imports, at module level or inside functions.

    A package importing its own submodules (its public face) is not an edge.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            graph[name].update(t for t in targets
                               if t in modules and t != name and not t.startswith(name + "."))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (depth-first search with colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_src():
    graph = import_graph()
    assert len(graph) > 40 and graph["tpulm.training.loop"]  # the graph really was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_reading_configs_manifests_and_metrics_imports_neither_keras_nor_tensorflow():
    code = (
        "import sys\n"
        "import tpulm.cli, tpulm.config, tpulm.model.config, tpulm.data.shards, tpulm.metrics_log\n"
        "import tpulm.training, tpulm.hf.convert, tpulm.pipeline, tpulm.report\n"
        "heavy = sorted(m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_readme_map_matches_the_tree():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Where things are", 1)[1].split("```", 2)[1]
    listed, parents = set(), []
    for line in block.splitlines():
        match = re.match(r"^(\s*)(\S+?/?)\s{2,}\S", line + "  x") if line.strip() else None
        if not match or not (match.group(2).endswith("/") or match.group(2).endswith(".py")):
            continue
        depth = len(match.group(1)) // 2
        parents = parents[:depth] + [match.group(2).rstrip("/")]
        listed.add("/".join(parents))
    listed = {p.removeprefix("src/") for p in listed if p.startswith("src/tpulm/")}
    actual = {str(p.relative_to(SRC)) for p in PACKAGE.rglob("*")
              if p.name not in ("__init__.py", "__main__.py", "__pycache__")
              and "__pycache__" not in p.parts and (p.is_dir() or p.suffix == ".py")}

    def covered(path: str) -> bool:  # listed, or inside a listed folder whose files are not listed
        parent = path.rsplit("/", 1)[0]
        return path in listed or (parent in listed and not any(x.startswith(parent + "/") for x in listed))

    assert not [p for p in sorted(actual) if not covered(p)], "modules missing from README's map"
    assert not sorted(listed - actual), "README's map lists paths that do not exist"
