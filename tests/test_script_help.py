"""The scripts' --help opens with their docstring's first paragraph whole: a first line alone stopped mid-sentence
(bench_ray's "... with 1 vs N workers,", infer_many_host's "..., on").

Each script's ``ArgumentParser(description=...)`` taken from ``__doc__`` is read from its syntax tree and
evaluated on that docstring, so the check imports none of the scripts (several need CuPy and a GPU).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))


def docstring_descriptions(path: Path) -> list[str]:
    """The descriptions ``path``'s argument parsers take from part of its docstring, as they evaluate (a whole
    docstring, shown as written, may end on its usage lines)."""
    tree = ast.parse(path.read_text())
    doc = ast.get_docstring(tree, clean=False)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser":
            for keyword in node.keywords:
                if keyword.arg == "description" and "__doc__" in ast.unparse(keyword.value):
                    code = compile(ast.Expression(keyword.value), str(path), "eval")
                    description = eval(code, {"__doc__": doc})  # the repository's own expression
                    if description != doc:
                        found.append(description)
    return found


@pytest.mark.parametrize("path", SCRIPTS, ids=[path.name for path in SCRIPTS])
def test_a_scripts_help_description_is_whole_sentences(path: Path) -> None:
    for description in docstring_descriptions(path):
        assert description.rstrip().endswith((".", ")")), f"{path.name}: --help says {description!r}"
