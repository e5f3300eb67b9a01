"""The package's layers import one way: a module may import its own layer and the
layers below it, never one above (the order is documented in the README's
architecture section and in ``circuitfade/__init__.py``). The tests follow the code: the library's
tests (``tests/library/``) import no study at module level."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from repo_root import REPO


PKG = REPO / "circuitfade"

# lowest first; a module's layer is that of its first dotted component below circuitfade
LAYERS = ["io", "stats", "claims", "compat", "model", "tasks", "gating", "train", "store", "analysis", "viz", "commands",
          "cli", "__main__"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# same-rank groups (layers that may not import each other at all)
PEERS: set[frozenset] = set()


def _layer(module: str) -> str:
    parts = module.split(".")
    assert parts[0] == "circuitfade", module
    return parts[1] if len(parts) > 1 else "__init__"


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        yield name, path


def _imports(name: str, path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(("circuitfade", "studies")):
                    yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "studies":
                yield node.lineno, mod  # never allowed: reported by _violations
                continue
            if not mod.startswith("circuitfade"):
                continue
            if mod == "circuitfade":  # `from circuitfade import x`: x is the layer
                for a in node.names:
                    yield node.lineno, f"circuitfade.{a.name}"
            else:
                yield node.lineno, mod


def _violations():
    out = []
    for name, path in _modules():
        src = _layer(name)
        if src == "__init__":
            continue
        for lineno, mod in _imports(name, path):
            if mod.split(".")[0] == "studies":
                out.append(f"{path.relative_to(PKG.parent)}:{lineno}: the library imports a study ({mod})")
                continue
            dst = _layer(mod)
            if dst in ("__init__", "__version__"):
                continue
            assert dst in RANK, f"{mod} (imported by {name}) belongs to no layer: add it to LAYERS"
            if RANK[dst] > RANK[src]:
                out.append(f"{path.relative_to(PKG.parent)}:{lineno}: {src} imports higher layer {mod}")
    return out


def test_every_module_has_a_layer():
    for name, _ in _modules():
        layer = _layer(name)
        assert layer == "__init__" or layer in RANK, f"{name}: no layer; add it to LAYERS in this test"


def test_imports_point_down():
    bad = _violations()
    assert not bad, "lower layers import higher ones:\n" + "\n".join(bad)


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    # planted: a model module importing the analysis layer must be reported
    fake = tmp_path / "circuitfade" / "model"
    fake.mkdir(parents=True)
    (tmp_path / "circuitfade" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text("from circuitfade.analysis import heads\nfrom ..io import atomic_write\n")
    monkeypatch.setattr(__import__(__name__), "PKG", tmp_path / "circuitfade")
    bad = _violations()
    assert len(bad) == 1 and "model imports higher layer circuitfade.analysis" in bad[0]


def test_the_checker_sees_a_study_import(tmp_path, monkeypatch):
    # planted: a library module importing a study (beside the package) must be reported
    fake = tmp_path / "circuitfade" / "viz"
    fake.mkdir(parents=True)
    (tmp_path / "circuitfade" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text("def f():\n    from studies.paper import protocol\n")
    monkeypatch.setattr(__import__(__name__), "PKG", tmp_path / "circuitfade")
    bad = _violations()
    assert len(bad) == 1 and "imports a study (studies.paper)" in bad[0]


def _module_level_study_imports(folder: Path) -> list[str]:
    out = []
    for path in sorted(folder.rglob("test_*.py")):
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            out += [f"{path.relative_to(folder)}:{node.lineno}: {n}" for n in names if n.split(".")[0] == "studies"]
    return out


def test_the_librarys_tests_import_no_study_at_module_level():
    """The tests are laid out like the code: a test file that imports a study at module level tests that study
    and belongs in tests/studies/ (a library test may still run a study inside one test function)."""
    bad = _module_level_study_imports(REPO / "tests" / "library")
    assert not bad, "library tests that import a study (move them to tests/studies/):\n" + "\n".join(bad)


def test_the_test_layout_checker_sees_a_study_import(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "test_x.py").write_text("import os\nfrom studies.paper import protocol\n\n\n"
                                                   "def test_y():\n    import studies.history\n")
    assert _module_level_study_imports(tmp_path) == ["model/test_x.py:2: studies.paper"]


def test_test_file_names_are_unique_across_the_test_folders():
    """tests/conftest.py puts every test folder on sys.path and the folders are no packages: pytest imports a
    test file by its name, so two files of one name in two folders would clash."""
    names = [p.name for p in (REPO / "tests").rglob("*.py") if "data" not in p.relative_to(REPO / "tests").parts]
    assert len(names) == len(set(names)), sorted(n for n in set(names) if names.count(n) > 1)


def test_names_that_moved_up_say_where_they_went():
    # what left viz is not re-exported there (viz would import a higher layer): asking for it
    # at the old place, as an attribute or with from-import, names the new place
    import importlib

    import pytest

    moved = {
        ("circuitfade.viz.report", "analyze"): "circuitfade.commands.analyze.analyze",
        ("circuitfade.viz.report", "analyze_main"): "circuitfade.commands.analyze.analyze_main",
        ("circuitfade.viz.report", "markdown_table"): "circuitfade.viz.tables.markdown_table",
        ("circuitfade.viz.screens", "run"): "circuitfade.commands.screen.run",
        ("circuitfade.viz.screens", "main"): "circuitfade.commands.screen.main",
        ("circuitfade.viz.command", "guarded"): "circuitfade.commands.boundary.guarded",
        ("circuitfade.viz.plots", "ExportError"): "circuitfade.viz.export.ExportError",
        ("circuitfade.viz.plots", "save_figure"): "circuitfade.viz.export.save_figure",
        ("circuitfade.viz.attention", "attention_patterns"): "circuitfade.analysis.attention.attention_series",
    }
    for (module, name), new in moved.items():
        mod = importlib.import_module(module)
        with pytest.raises(ImportError, match=re.escape(new)):
            getattr(mod, name)
        with pytest.raises(ImportError, match=re.escape(new)):
            exec(f"from {module} import {name}", {})
        new_module, new_name = new.rsplit(".", 1)
        assert hasattr(importlib.import_module(new_module), new_name)
    import circuitfade.viz.plots as plots
    from circuitfade.viz import export

    assert plots.save is export.save and "save" not in plots.__all__  # one documented name, one home
    with pytest.raises(AttributeError):
        getattr(plots, "no_such_name")
    assert not hasattr(plots, "no_such_name")
