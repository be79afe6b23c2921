#!/usr/bin/env python3
"""Lists file-level import cycles inside each crate of the workspace.

A file `a.rs` imports `b.rs` when it names `crate::b` (or `crate::b::…`, `super::b` from a
sibling, or `crate::x::b` for `x/b.rs`). Prints each cycle (strongly connected component with
more than one file) and exits 1 if there is any. Usage: scripts/import-cycles.py [ROOT]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
PATH_RE = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def module_of(src: pathlib.Path, file: pathlib.Path) -> tuple:
    parts = list(file.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return tuple(parts)


def crate_graph(src: pathlib.Path) -> dict:
    files = {module_of(src, f): f for f in src.rglob("*.rs")}
    graph = {module: set() for module in files}
    for module, file in files.items():
        text = file.read_text(errors="replace")
        # `#[cfg(test)] mod tests` blocks may import anything of their parent: skip them.
        text = text.split("#[cfg(test)]\nmod tests")[0]
        # Comments name modules without importing them.
        text = "\n".join(line.split("//")[0] for line in text.splitlines())
        for match in PATH_RE.finditer(text):
            anchor, rest = match.group(1), match.group(2).split("::")[1:]
            base = () if anchor == "crate" else module[:-1]
            # The longest prefix that names a file of this crate.
            for length in range(len(rest), 0, -1):
                target = base + tuple(rest[:length])
                if target in files and target != module and not module[: len(target)] == target:
                    graph[module].add(target)
                    break
    return graph


def cycles(graph: dict) -> list:
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for next_node in graph[node]:
            if next_node not in index:
                visit(next_node)
                low[node] = min(low[node], low[next_node])
            elif next_node in on_stack:
                low[node] = min(low[node], index[next_node])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def main() -> int:
    status = 0
    for manifest in sorted(ROOT.glob("*/*/Cargo.toml")) + sorted(ROOT.glob("tests/Cargo.toml")):
        src = manifest.parent / "src"
        if not src.is_dir():
            continue
        for component in cycles(crate_graph(src)):
            status = 1
            names = ", ".join("/".join(module) or "lib" for module in component)
            print(f"{manifest.parent}: {names}")
    return status


if __name__ == "__main__":
    sys.exit(main())
