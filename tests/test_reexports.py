"""The modules split by what their parts do keep every name their users take from them: `helpers.memory_plan`
and `helpers.integrations.trl_fsdp` list in `__all__` each name a notebook, a module, a benchmark, a tool or a
test imports from them or reads off them, and each listed name is the object of the module that holds it."""

from __future__ import annotations

import ast
import importlib
import json
import sys
from collections.abc import Iterator

import pytest

from helpers.paths import ROOT

# each split module, with names its users are known to take from it (the scan must find them)
SPLIT = {"helpers.memory_plan": {"count_parameters", "fsdp_with_layers_in_flight", "readme_table"},
         "helpers.integrations.trl_fsdp": {"set_accelerate_config", "ShardsFromRank0", "plot_losses"}}


def sources() -> Iterator[str]:
    """The Python of the repository's packages, scripts and tests, and every notebook's code cells (their
    `%` and `!` lines left out)."""
    for folder in ("helpers", "benchmarks", "tools", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.read_text()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "code":
                yield "\n".join(line for line in "".join(cell["source"]).splitlines()
                                if not line.lstrip().startswith(("%", "!")))


def names_used_from(module: str, source: str) -> set[str]:
    """The names `source` imports from `module` (`from helpers.memory_plan import x`) or reads off it under
    the name it imported it as (`from helpers import memory_plan as mp`, then `mp.x`)."""
    package, _, leaf = module.rpartition(".")
    tree = ast.parse(source)
    names, aliases = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            aliases |= {a.asname or a.name for a in node.names if a.name == leaf}
    names |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
              and isinstance(node.value, ast.Name) and node.value.id in aliases}
    return {n for n in names if not n.startswith("__")}   # the module's own attributes (__all__, __name__)


@pytest.mark.parametrize("module", SPLIT)
def test_every_name_used_from_a_split_module_is_reexported(module):
    used = set().union(*(names_used_from(module, source) for source in sources()))
    assert SPLIT[module] <= used, f"the scan missed {SPLIT[module] - used} of {module}: it is broken"
    imported = importlib.import_module(module)
    missing = sorted(used - set(imported.__all__))
    assert not missing, f"{missing} are used from {module}, but its __all__ does not list them: add them"
    for name in imported.__all__:
        value = getattr(imported, name)
        home = sys.modules[getattr(value, "__module__", None) or module]
        assert getattr(home, name, value) is value, f"{module}.{name} is not {home.__name__}.{name}"


def test_the_scan_finds_imported_and_attribute_names():
    source = ("from helpers import memory_plan as mp\nfrom helpers.memory_plan import a, b\n"
              "mp.c\nother.d\nmp.__all__\n")
    assert names_used_from("helpers.memory_plan", source) == {"a", "b", "c"}
    assert names_used_from("helpers.integrations.trl_fsdp",
                           "from helpers.integrations import trl_fsdp\ntrl_fsdp.e()\n") == {"e"}
