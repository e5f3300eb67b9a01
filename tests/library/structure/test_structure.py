"""The shape of the code base, checked from its source: no import cycles, no imports of another
module's private names, one process pool, studies that never import the CLI, viz modules that
only draw, the verdict words in one place, short study functions, product words only, a small
fast command line. Each checker is also run on a planted violation, so a checker that sees
nothing cannot pass by accident."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repo_root import REPO

TOP = ("circuitfade", "studies")


def _module_name(path: Path, root: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


def _sources(root: Path = REPO) -> dict[str, Path]:
    return {_module_name(p, root): p for top in TOP for p in sorted((root / top).rglob("*.py"))}


def _import_edges(root: Path = REPO) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> modules it imports (function-local imports included), and every
    ``from X import _private`` across modules."""
    mods = _sources(root)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private = []
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in TOP:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    dst = full if full in mods else node.module
                    if dst in mods and dst != m:
                        edges[m].add(dst)
                    if a.name.startswith("_") and not a.name.startswith("__") and dst != m:
                        private.append(f"{m} imports {dst}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.name != m:
                        edges[m].add(a.name)
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of size > 1 (Tarjan), leaving out a package and its own
    submodule importing each other (``pkg/__init__`` re-exporting ``pkg.mod``)."""
    index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return [c for c in comps if not (len(c) == 2 and (c[1].startswith(c[0] + ".") or c[0].startswith(c[1] + ".")))]


def test_no_import_cycles_and_no_private_imports():
    edges, private = _import_edges()
    assert not _cycles(edges), _cycles(edges)
    assert not private, private


def test_the_cycle_and_private_checkers_see_planted_violations(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    (tmp_path / "studies" / "a.py").write_text("def f():\n    from studies.b import g\n")
    (tmp_path / "studies" / "b.py").write_text("from studies.a import f\nfrom circuitfade.x import _hidden\n")
    (tmp_path / "circuitfade" / "x.py").write_text("_hidden = 1\n")
    edges, private = _import_edges(tmp_path)
    assert _cycles(edges) == [["studies.a", "studies.b"]]
    assert private == ["studies.b imports circuitfade.x._hidden"]


def _pool_makers(root: Path = REPO) -> list[str]:
    out = []
    for m, path in _sources(root).items():
        text = path.read_text()
        if re.search(r"\bProcessPoolExecutor\(|\bmultiprocessing\.Pool\(|\bmp\.Pool\(|\bget_context\([^)]*\)\.Pool\(", text):
            out.append(m)
    return out


def test_exactly_one_module_creates_a_process_pool():
    assert _pool_makers() == ["circuitfade.train.jobs"]


def test_the_pool_checker_sees_a_second_pool(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "studies" / "s.py").write_text("from concurrent.futures import ProcessPoolExecutor\n"
                                               "pool = ProcessPoolExecutor(2)\n")
    assert _pool_makers(tmp_path) == ["studies.s"]


def _study_cli_imports(root: Path = REPO) -> list[str]:
    """``module:line`` for every import of :mod:`circuitfade.cli` under ``studies/`` (a study's command
    uses :mod:`circuitfade.commands.boundary`, as the CLI does; the CLI is the package's top)."""
    out = []
    for m, path in _sources(root).items():
        if not m.startswith("studies"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(n == "circuitfade.cli" or n.startswith("circuitfade.cli.") for n in names):
                out.append(f"{m}:{node.lineno}")
    return out


def test_no_study_imports_the_cli():
    assert not _study_cli_imports(), _study_cli_imports()


def test_the_study_cli_checker_sees_planted_imports(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "studies" / "a.py").write_text("from circuitfade.cli import guarded\n")
    (tmp_path / "studies" / "b.py").write_text("def f():\n    import circuitfade.cli\n    from circuitfade import cli\n")
    (tmp_path / "studies" / "c.py").write_text("from circuitfade.commands.boundary import guarded\n")
    assert _study_cli_imports(tmp_path) == ["studies.a:1", "studies.b:2", "studies.b:3"]


PARSER_CALLS = frozenset({"ArgumentParser", "Parser", "add_argument", "add_argument_group", "add_subparsers",
                          "add_parser", "parse_args"})
"""Calls that build or run a command-line parser."""
PIPELINE_CALLS = frozenset({"attach", "open_run", "trace", "train", "branch", "run_sweep", "fit", "screen_series",
                            "run_with_cache", "run_with_hooks"})
"""Calls that load checkpoints, run models or train: the work the layers below and above viz do."""


def _viz_doing_other_jobs(root: Path = REPO) -> list[str]:
    """``module:line what`` for every ``argparse`` import, parser-building call (:data:`PARSER_CALLS`)
    and pipeline call (:data:`PIPELINE_CALLS`) in ``circuitfade.viz``: viz draws finished results;
    the pipelines and command lines are :mod:`circuitfade.commands`."""
    out = []
    for m, path in _sources(root).items():
        if not (m == "circuitfade.viz" or m.startswith("circuitfade.viz.")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names) or \
                    isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
                out.append(f"{m}:{node.lineno} imports argparse")
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in PARSER_CALLS:
                    out.append(f"{m}:{node.lineno} builds a parser ({name})")
                elif name in PIPELINE_CALLS:
                    out.append(f"{m}:{node.lineno} runs a pipeline ({name})")
    return out


def test_viz_only_draws():
    assert not _viz_doing_other_jobs(), _viz_doing_other_jobs()


def test_the_viz_checker_sees_planted_parsers_and_pipelines(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "circuitfade" / "viz").mkdir()
    (tmp_path / "circuitfade" / "viz" / "__init__.py").write_text("")
    (tmp_path / "circuitfade" / "viz" / "report.py").write_text(
        "import argparse\n"
        "from circuitfade.store import attach, trace\n"
        "def main(argv):\n"
        "    ap = argparse.ArgumentParser()\n"
        "    ap.add_argument('run')\n"
        "    series = attach(ap.parse_args(argv).run)\n"
        "    return trace(series, [])\n"
        "def fig(go):\n"
        "    return go.Figure().add_trace(go.Bar(y=[1]))\n")  # figures are its job
    (tmp_path / "studies" / "s.py").write_text("import argparse\nargparse.ArgumentParser()\n")  # not viz
    assert sorted(_viz_doing_other_jobs(tmp_path)) == [
        "circuitfade.viz.report:1 imports argparse", "circuitfade.viz.report:4 builds a parser (ArgumentParser)",
        "circuitfade.viz.report:5 builds a parser (add_argument)", "circuitfade.viz.report:6 builds a parser (parse_args)",
        "circuitfade.viz.report:6 runs a pipeline (attach)", "circuitfade.viz.report:7 runs a pipeline (trace)"]


OUTCOME_WORDS = ("reproduced", "not reproduced", "partly", "inconclusive", "not testable")


def _outcome_literals(root: Path = REPO) -> list[str]:
    """String constants (not docstrings) equal to a verdict word, outside circuitfade.claims."""
    out = []
    for m, path in _sources(root).items():
        if m == "circuitfade.claims":
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs \
                    and n.value.strip() in OUTCOME_WORDS:
                out.append(f"{m}:{n.lineno}: {n.value!r}")
    return out


def test_the_outcome_words_are_defined_only_in_claims():
    assert not _outcome_literals(), _outcome_literals()


def test_the_outcome_checker_sees_a_literal(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "studies" / "s.py").write_text('"""reproduced in a docstring is fine."""\nv = "not reproduced"\n')
    assert _outcome_literals(tmp_path) == ["studies.s:2: 'not reproduced'"]


def _long_functions(root: Path = REPO, limit: int = 80) -> list[str]:
    out = []
    for m, path in _sources(root).items():
        if not m.startswith("studies"):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit:
                out.append(f"{m}.{n.name}: {n.end_lineno - n.lineno + 1} lines")
    return out


def test_no_study_function_is_longer_than_80_lines():
    assert not _long_functions(), _long_functions()


def test_the_length_checker_sees_a_long_function(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "studies" / "s.py").write_text("def f():\n" + "    x = 1\n" * 80)
    assert _long_functions(tmp_path) == ["studies.s.f: 81 lines"]


TRAINING_CALLS = ("backward", "zero_grad", "step")
HAND_WRITTEN_LOOPS_ALLOWED = {
    "studies.alignment.fdt.anneal_demo": "particles in a double well (one tensor, no model): shows LangevinNoise "
                                         "on its own",
    "studies.alignment.occupation.simulate": "the closed-form occupation toy (three logit tensors, no model, "
                                             "batched over seeds): nothing for fit to run",
}
"""Study functions that may step an optimizer by hand, each with the reason: toy loops that train no model."""


def _hand_written_training(root: Path = REPO) -> list[str]:
    """``module.function:line .name()`` for every ``.backward()`` / ``.zero_grad()`` / ``.step()`` call in the
    studies (models are trained by ``fit`` with callbacks), less :data:`HAND_WRITTEN_LOOPS_ALLOWED`."""
    out = []
    for m, path in _sources(root).items():
        if not m.startswith("studies"):
            continue

        def visit(node: ast.AST, where: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(child, f"{where}.{child.name}")
                    continue
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                        and child.func.attr in TRAINING_CALLS and where not in HAND_WRITTEN_LOOPS_ALLOWED:
                    out.append(f"{where}:{child.lineno} .{child.func.attr}()")
                visit(child, where)

        visit(ast.parse(path.read_text()), m)
    return out


def test_no_study_function_steps_an_optimizer_by_hand():
    assert not _hand_written_training(), _hand_written_training()


def test_the_training_call_checker_sees_a_planted_loop(tmp_path):
    for top in TOP:
        (tmp_path / top).mkdir()
    (tmp_path / "studies" / "s.py").write_text(
        "def train(model, opt, loss):\n"
        "    for _ in range(3):\n"
        "        opt.zero_grad()\n"
        "        loss(model).backward()\n"
        "        opt.step()\n"
        "class K:\n"
        "    def go(self):\n"
        "        self.optimizer.step()\n")
    assert _hand_written_training(tmp_path) == [
        "studies.s.train:3 .zero_grad()", "studies.s.train:4 .backward()", "studies.s.train:5 .step()",
        "studies.s.K.go:8 .step()"]


def test_every_allowed_hand_written_loop_still_exists_and_has_a_reason():
    names = {f"{m}.{n.name}" for m, path in _sources().items() for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.FunctionDef)}
    for name, why in HAND_WRITTEN_LOOPS_ALLOWED.items():
        assert name in names and len(why) > 20, name


PRODUCT_WORDS = re.compile(r"issue [0-9]+|\.\./shared|seeds/0|load average")


def _off_product(root: Path = REPO) -> list[str]:
    out = []
    files = [root / "README.md"] + [p for d in ("docs", "circuitfade", "studies", "results") if (root / d).is_dir()
                                    for p in (root / d).rglob("*") if p.is_file() and p.suffix in
                                    (".md", ".py", ".csv", ".json", ".txt", ".yml", ".yaml")]
    for p in files:
        if not p.is_file():
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if PRODUCT_WORDS.search(line):
                out.append(f"{p.relative_to(root)}:{i}")
    return out


def test_product_words_only():
    bad = _off_product()
    assert not bad, bad[:20]


def test_the_product_word_checker_sees_an_issue_number(tmp_path):
    (tmp_path / "README.md").write_text("fine\nfixed in issue 12\n")
    assert _off_product(tmp_path) == ["README.md:2"]


def test_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200 and len(text.encode()) <= 15 * 1024


def test_circuitfade_cli_has_at_most_six_subcommands():
    from circuitfade.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert len(sub.choices) <= 6, sorted(sub.choices)


def _median_wall(cmd: list[str], n: int = 3) -> float:
    walls = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, cwd=REPO)
        walls.append(time.perf_counter() - t0)
    return sorted(walls)[n // 2]


def test_cli_help_imports_nothing_heavy():
    """``circuitfade --help`` builds its parser without torch, TransformerLens or pandas (the
    brief's "under 2 s" is a consequence; timed side by side in benchmarks/cli_help.py)."""
    code = ("import sys, contextlib, io\nfrom circuitfade.cli import build_parser\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        build_parser().parse_args(['--help'])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('torch', 'transformer_lens', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("study", ["paper", "removability", "history", "development", "alignment"])
def test_every_study_has_a_help(study):
    from warm_python import run_python

    out = run_python(["-m", f"studies.{study}", "--help"], REPO)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()


def test_one_checkpoint_name_pattern():
    """The trainer's checkpoint names are parsed in one place (train.rundir.parse_checkpoint_name)."""
    import re as _re
    root = REPO
    hits = [str(p.relative_to(root)) for p in (root / "circuitfade").rglob("*.py")
            if _re.search(r"step_\(\\d\+\)", p.read_text())]
    assert hits == ["circuitfade/train/rundir.py"], hits
    from circuitfade.train.checkpoints import checkpoint_name, parse_checkpoint_name

    assert parse_checkpoint_name(checkpoint_name(300)) == (300, False)
    assert parse_checkpoint_name(checkpoint_name(7, state=True)) == (7, True)
    assert parse_checkpoint_name("step_40.safetensors") == (40, False)  # parsed; the trainer refuses the spelling
    assert parse_checkpoint_name("ckpt_40.pt") is None and parse_checkpoint_name("step_x.safetensors") is None


RUN_FILE_NAMES = frozenset({"config.json", "metrics.csv", "done.json", "failed.json", "checkpoints", ".lock"})
"""The names of a run folder's files (circuitfade.train.rundir owns them)."""
_CHECKPOINT_LITERAL = re.compile(r"step_\d+(\.state)?\.safetensors")
OTHER_CONFIG_JSON = frozenset({
    "circuitfade/model/files.py",  # a saved model's folder (config.json + model.safetensors)
    "circuitfade/compat.py",  # a Hugging Face model folder
    "circuitfade/store/hf.py",
    "circuitfade/store/revisions.py",
    "circuitfade/store/sources.py",  # a folder of state-dict files with their model config beside them
    "studies/history/study.py",  # a study's output folder
    "studies/circuits/study.py",
    "benchmarks/trace_memory.py",  # a folder of Pythia-shaped checkpoints
})
"""Modules where ``config.json`` names the file of another kind of folder, not a run's."""


def run_folder_names(source: str, rel: str) -> list[str]:
    """``"line: 'name'"`` for each string constant of ``source`` (a module at ``rel``) that spells a
    run-folder file name (docstrings and dict keys aside)."""
    tree = ast.parse(source)
    skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    skip |= {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys if k is not None}
    skip |= {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)}  # row["checkpoints"]
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Constant) and isinstance(n.value, str)) or id(n) in skip:
            continue
        v = n.value
        if v == "config.json" and rel in OTHER_CONFIG_JSON:
            continue
        if v in RUN_FILE_NAMES or _CHECKPOINT_LITERAL.fullmatch(v) or v.endswith(".state.safetensors"):
            out.append((n.lineno, n.col_offset, f"{n.lineno}: {v!r}"))
    return [text for *_, text in sorted(out)]


def test_run_folder_names_are_spelled_only_in_rundir():
    """Every run-folder file name (config.json, metrics.csv, done.json, failed.json, checkpoints/, .lock,
    step_XXXXXX[.state].safetensors) is spelled in circuitfade/train/rundir.py only: code in circuitfade/,
    studies/ and benchmarks/ goes through RunDir."""
    hits = {}
    for top in ("circuitfade", "studies", "benchmarks"):
        for p in sorted((REPO / top).rglob("*.py")):
            rel = str(p.relative_to(REPO))
            if rel == "circuitfade/train/rundir.py":
                continue
            found = run_folder_names(p.read_text(), rel)
            if found:
                hits[rel] = found
    assert hits == {}, hits
    own = run_folder_names((REPO / "circuitfade/train/rundir.py").read_text(), "circuitfade/train/rundir.py")
    assert len(own) >= len(RUN_FILE_NAMES), own  # the check sees the names where they are spelled


def test_the_run_folder_check_catches_a_planted_spelling():
    planted = (
        'def f(d):\n'
        '    """Reads d / "done.json"."""\n'  # a docstring: allowed
        '    meta = {"checkpoints": 3}\n'  # a dict key: allowed
        '    n = meta["checkpoints"]\n'  # a key again
        '    return (d / "done.json").is_file(), d / "checkpoints" / "step_000300.state.safetensors"\n'
    )
    assert run_folder_names(planted, "studies/x.py") == [
        "5: 'done.json'", "5: 'checkpoints'", "5: 'step_000300.state.safetensors'"]
    assert run_folder_names('x = d / "config.json"\n', "studies/x.py") == ["1: 'config.json'"]
    assert run_folder_names('x = d / "config.json"\n', "circuitfade/model/files.py") == []


def test_the_front_door_gives_each_name_once_and_stays_cheap():
    """``import circuitfade as cf``: every name of ``cf.__all__`` resolves to the object its module
    exports, no front-door name is an alias of another, and the import itself loads no torch."""
    import subprocess
    import sys as _sys

    import circuitfade as cf

    names = [n for n in cf.__all__ if n != "__version__"]
    assert 20 <= len(names) <= 30 and len(set(names)) == len(names)
    objects = [getattr(cf, n) for n in names]
    assert len({id(o) for o in objects}) == len(objects)  # no two names for one object
    assert cf.plots.__name__ == "circuitfade.viz.plots" and cf.trace.__name__ == "trace"
    import circuitfade.train  # noqa: F401  (Python now sets the package as cf.train: it trains all the same)
    from circuitfade.train.loop import train

    assert callable(cf.train)
    calls = []
    import circuitfade.train.loop as loop

    original = loop.train
    try:
        import circuitfade.train as package

        package.train = lambda *a, **k: calls.append((a, k)) or "trained"  # the function the package calls
        assert cf.train("cfg", None, progress=False) == "trained" and calls == [(("cfg", None), {"progress": False})]
    finally:
        package.train = original
    assert package.train is train
    try:
        cf.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name resolved")
    r = subprocess.run([_sys.executable, "-c", "import sys, circuitfade; print('torch' in sys.modules)"],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


# ------------------------------------------------------------------------------ the public surface
PUBLIC_PACKAGES = ("circuitfade.analysis", "circuitfade.gating", "circuitfade.model", "circuitfade.store",
                   "circuitfade.tasks", "circuitfade.train")
"""The subpackages whose ``__init__`` ``__all__`` is public (with the front door, ``circuitfade.__all__``)."""
PUBLIC_LIMIT = 120
"""The most public names the package may have (:func:`_public_names`)."""


def _module_path(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _bindings(module: str, root: Path) -> dict[str, tuple]:
    """What each top-level name of ``module`` is bound to: ``("def",)`` (a def, class or assignment of an
    expression), ``("from", module, name)`` (an import), ``("alias", name)`` (``a = b``: another name of this
    module)."""
    path = _module_path(module, root)
    if path is None:
        return {}
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out: dict[str, tuple] = {}
    body = list(ast.parse(path.read_text()).body)
    while body:
        node = body.pop(0)
        if isinstance(node, (ast.If, ast.Try)):
            body[:0] = node.body
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = ("def",)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                src = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                out[a.asname or a.name] = ("from", src, a.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            out[node.targets[0].id] = ("alias", value.id) if isinstance(value, ast.Name) else ("def",)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = ("def",)
    return out


def _definition(module: str, name: str, root: Path = REPO) -> str:
    """``module.name`` of the object that ``module``'s ``name`` is, following imports and ``a = b`` to the
    module that defines it (a submodule imported as a name is that module)."""
    for _ in range(20):
        if _module_path(f"{module}.{name}", root) is not None and name not in _bindings(module, root):
            return f"{module}.{name}"
        b = _bindings(module, root).get(name, ("def",))
        if b[0] == "def":
            return f"{module}.{name}"
        if b[0] == "alias":
            name = b[1]
        elif not b[1].startswith(TOP):
            return f"{b[1]}.{b[2]}"
        else:
            module, name = b[1], b[2]
    raise AssertionError(f"{module}.{name}: imports go round in circles")


def _literal(module: str, name: str, root: Path):
    path = _module_path(module, root)
    for node in ast.parse(path.read_text()).body if path is not None else ():
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", "") in ("frozenset", "set", "tuple", "list"):
                value = value.args[0] if value.args else ast.List(elts=[])
            if isinstance(value, ast.List):  # ["__version__", *FRONT_DOOR]: the keys of FRONT_DOOR
                return [x for e in value.elts for x in
                        (_literal(module, e.value.id, root) if isinstance(e, ast.Starred) else [ast.literal_eval(e)])]
            return ast.literal_eval(value)
    return None


def _public_names(root: Path = REPO) -> dict[str, str]:
    """Every public name, as ``{"place.name": "defining_module.defining_name"}``.

    A public name is (1) a name of the ``__all__`` of a subpackage in :data:`PUBLIC_PACKAGES`
    (``circuitfade.analysis.evaluate``), or (2) a name of the front door, ``circuitfade.__all__``
    (``cf.Claim``), dunder names (``__version__``) aside. A front-door name that :data:`FRONT_DOOR` maps to a
    public subpackage exporting it is that subpackage's public name, not a second one (``cf.trace`` is
    ``circuitfade.store.trace``); mapped anywhere else, the front door is its one place. The ``__all__`` of
    a module that is no such package (``circuitfade.analysis.heads``, ``circuitfade.stats``) says what the
    module's reference page shows; its names are importable from there but are not counted (a module's
    ``__all__``)."""
    out: dict[str, str] = {}
    exported = {pkg: _literal(pkg, "__all__", root) or [] for pkg in PUBLIC_PACKAGES}
    for pkg, names in exported.items():
        for name in names:
            out[f"{pkg}.{name}"] = _definition(pkg, name, root)
    front = _literal("circuitfade", "FRONT_DOOR", root) or {}
    modules = _literal("circuitfade", "MODULES", root) or ()
    for name in _literal("circuitfade", "__all__", root) or []:
        if name.startswith("__"):
            continue
        home = front.get(name, "circuitfade")
        if home in exported and name in exported[home]:
            continue
        out[f"circuitfade.{name}"] = home if name in modules else _definition(home, name, root)
    return out


def _export_problems(public: dict[str, str]) -> list[str]:
    """An object exported under a name not its own (an alias) or from more than one place."""
    out = []
    by_object: dict[str, list[str]] = {}
    for name, obj in public.items():
        by_object.setdefault(obj, []).append(name)
        if name.rsplit(".", 1)[1] != obj.rsplit(".", 1)[1]:
            out.append(f"{name} is another name of {obj}")
    out += [f"{obj} is exported as {', '.join(sorted(names))}" for obj, names in by_object.items() if len(names) > 1]
    return sorted(out)


def test_the_public_surface_is_small_and_each_name_has_one_place():
    """The package's public names (:func:`_public_names`, the definition docs/api/index.md states) number at
    most :data:`PUBLIC_LIMIT`; none is an alias of another; no object is public in two places."""
    public = _public_names()
    assert len(public) <= PUBLIC_LIMIT, f"{len(public)} public names (at most {PUBLIC_LIMIT})"
    assert not _export_problems(public), _export_problems(public)


def test_the_public_surface_checkers_see_planted_violations(tmp_path):
    pkg = tmp_path / "circuitfade"
    (pkg / "analysis").mkdir(parents=True)
    (pkg / "store").mkdir()
    (pkg / "__init__.py").write_text(
        'FRONT_DOOR = {"trace": "circuitfade.store", "mass": "circuitfade.analysis.heads", '
        '"head_label": "circuitfade.store.tracing", "heads": "circuitfade.analysis.heads"}\n'
        'MODULES = frozenset({"heads"})\n__all__ = ["__version__", *FRONT_DOOR]\n')
    (pkg / "store" / "tracing.py").write_text('__all__ = ["trace", "head_label"]\n'
                                              "def trace(): ...\ndef head_label(): ...\n")
    (pkg / "store" / "__init__.py").write_text('from .tracing import trace, head_label\n'
                                               '__all__ = ["trace", "head_label"]\n')
    (pkg / "analysis" / "heads.py").write_text(
        'from circuitfade.store.tracing import head_label\n'
        '__all__ = ["mass", "value_mass", "head_label"]\n'
        'def mass(): ...\nvalue_mass = mass\n')
    (pkg / "analysis" / "__init__.py").write_text(
        'from circuitfade.analysis.heads import mass, value_mass, head_label as label\n'
        '__all__ = ["mass", "value_mass", "label"]\n')
    public = _public_names(tmp_path)
    assert public == {
        "circuitfade.analysis.mass": "circuitfade.analysis.heads.mass",
        "circuitfade.analysis.value_mass": "circuitfade.analysis.heads.mass",
        "circuitfade.analysis.label": "circuitfade.store.tracing.head_label",
        "circuitfade.store.trace": "circuitfade.store.tracing.trace",  # cf.trace: the same public name
        "circuitfade.store.head_label": "circuitfade.store.tracing.head_label",
        "circuitfade.mass": "circuitfade.analysis.heads.mass",  # mapped to a module, not to the package
        "circuitfade.head_label": "circuitfade.store.tracing.head_label",
        "circuitfade.heads": "circuitfade.analysis.heads",
    }
    assert _export_problems(public) == [
        "circuitfade.analysis.heads.mass is exported as circuitfade.analysis.mass, circuitfade.analysis.value_mass, "
        "circuitfade.mass",
        "circuitfade.analysis.label is another name of circuitfade.store.tracing.head_label",
        "circuitfade.analysis.value_mass is another name of circuitfade.analysis.heads.mass",
        "circuitfade.store.tracing.head_label is exported as circuitfade.analysis.label, circuitfade.head_label, "
        "circuitfade.store.head_label",
    ]
    assert len(public) == 8  # the count the limit is checked on


def test_the_limit_checker_fires_above_the_limit(monkeypatch):
    me = sys.modules[__name__]

    monkeypatch.setattr(me, "PUBLIC_LIMIT", len(_public_names()) - 1)
    with pytest.raises(AssertionError, match="public names"):
        me.test_the_public_surface_is_small_and_each_name_has_one_place()


def test_a_name_of_the_previous_release_warns_and_resolves_to_its_replacement():
    """Names users may hold from the README, docs or tutorials of the previous release resolve for one
    release, with a ``DeprecationWarning`` naming the replacement; they are in no ``__all__``."""
    import circuitfade as cf
    import circuitfade.analysis as analysis
    import circuitfade.gating as gating
    import circuitfade.store as store
    from circuitfade.gating.evaluation import evaluate_batch

    with pytest.warns(DeprecationWarning, match=r"circuitfade\.analysis\.successor_value_mass .*"
                                                r"use circuitfade\.analysis\.successor_mass"):
        old = analysis.successor_value_mass
    assert old is analysis.successor_mass and "successor_value_mass" not in analysis.__all__
    with pytest.warns(DeprecationWarning, match="use circuitfade.analysis.successor_mass"):
        assert cf.successor_value_mass is cf.successor_mass
    with pytest.warns(DeprecationWarning, match="use circuitfade.gating.NoGatesError"):
        from circuitfade.store import NoGates
    assert NoGates is gating.NoGatesError
    with pytest.warns(DeprecationWarning, match="use circuitfade.analysis.evaluate"):
        assert gating.evaluate_batch is evaluate_batch  # the trainer's form, still importable from its module
    with pytest.raises(AttributeError, match="no_such_name"):
        store.no_such_name
    for m in (analysis, gating, store):
        assert not set(m.__getattr__.moved) & set(m.__all__), m.__name__
