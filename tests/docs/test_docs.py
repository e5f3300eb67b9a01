"""The docs site: it builds with ``mkdocs build --strict``, its API pages cover every module of the
package, each study page includes its generated results file, and no page copies a row of one.

The code blocks of every page are run by ``tests/docs/test_readme.py``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_root import REPO

DOCS = REPO / "docs"
STUDIES = ("paper", "removability", "history", "development", "alignment")
API_PACKAGES = ("model", "tasks", "gating", "train", "store", "analysis", "viz", "commands")


def _pages() -> list[Path]:
    return [REPO / "README.md"] + sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def _nav_pages() -> list[str]:
    """Every ``name.md`` the mkdocs.yml nav names (read as text: the file uses mkdocs-only YAML tags)."""
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w/.-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M)


def test_every_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = _nav_pages()
    assert len(nav) >= 10 and len(nav) == len(set(nav)), nav
    pages = {str(p.relative_to(DOCS)) for p in _pages() if p.is_relative_to(DOCS)}
    assert set(nav) == pages, (sorted(set(nav) - pages), sorted(pages - set(nav)))
    assert {"index.md", "install.md", "model.md", "trajectories.md", "analysis.md", "tl4.md", "tutorials.md",
            "architecture.md", "benchmarks.md", "api/index.md"} <= set(nav)


def _modules(package: str, root: Path = REPO) -> list[str]:
    return sorted(f"circuitfade.{package}.{p.stem}" for p in (root / "circuitfade" / package).glob("*.py")
                  if p.stem != "__init__")


def _directives(page: Path) -> list[str]:
    return re.findall(r"^::: ([\w.]+)\s*$", page.read_text(), re.M)


def test_api_pages_cover_every_module_of_every_subpackage():
    for package in API_PACKAGES:
        page = DOCS / "api" / f"{package}.md"
        assert page.is_file(), f"no API page for circuitfade.{package}"
        found = _directives(page)
        assert found[0] == f"circuitfade.{package}", f"{page.name} does not start with the package's own docstring"
        assert sorted(found[1:]) == _modules(package), (
            f"{page.relative_to(REPO)} must list exactly the modules of circuitfade/{package}/: "
            f"missing {sorted(set(_modules(package)) - set(found))}, stale {sorted(set(found[1:]) - set(_modules(package)))}")
    for module in ("claims", "stats"):
        assert _directives(DOCS / "api" / f"{module}.md") == [f"circuitfade.{module}"]


def test_the_api_checker_sees_a_missing_module(tmp_path):
    (tmp_path / "circuitfade" / "train").mkdir(parents=True)
    for name in ("__init__", "loop", "sweep"):
        (tmp_path / "circuitfade" / "train" / f"{name}.py").write_text("")
    page = tmp_path / "train.md"
    page.write_text("::: circuitfade.train\n\n::: circuitfade.train.loop\n")
    assert _modules("train", tmp_path) == ["circuitfade.train.loop", "circuitfade.train.sweep"]
    assert sorted(_directives(page)[1:]) == ["circuitfade.train.loop"]


def test_every_study_page_includes_its_generated_results():
    for study in STUDIES:
        page = DOCS / "studies" / f"{study}.md"
        assert page.is_file(), f"no page for the {study} study"
        text = page.read_text()
        assert f"python -m studies.{study}" in text, f"{page.name} does not show the study's command"
        results = REPO / "results" / study / "results.md"
        include = f'--8<-- "results/{study}/results.md"'
        if results.is_file():
            assert include in text, f"{page.name} must include {results.relative_to(REPO)} (pymdownx.snippets)"
        for m in re.finditer(r'^--8<-- "([^"]+)"\s*$', text, re.M):
            assert (REPO / m.group(1)).is_file(), f"{page.name} includes a missing file {m.group(1)}"


def _rows(text: str) -> set[str]:
    """Data rows of the markdown tables in ``text`` (header and separator rows left out), normalised."""
    lines = text.splitlines()
    rows = set()
    for i, line in enumerate(lines):
        if not line.startswith("|") or re.fullmatch(r"[|\s:-]+", line):
            continue
        is_header = i + 1 < len(lines) and re.fullmatch(r"\|[\s:|-]+\|?", lines[i + 1] or "x")
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not is_header and len(cells) >= 3 and any(re.search(r"\d", c) for c in cells):
            rows.add(" | ".join(cells))
    return rows


def test_no_page_copies_a_table_row_of_a_results_file():
    generated = set()
    for f in (REPO / "results").rglob("*.md"):
        generated |= _rows(f.read_text())
    assert generated
    for page in _pages():
        copied = _rows(page.read_text()) & generated
        assert not copied, f"{page.relative_to(REPO)} copies rows of results/*.md (include the file): {sorted(copied)[:3]}"


def test_the_row_checker_sees_a_copied_row():
    results = "| a | b | c |\n|---|---|---|\n| fade | 0.783 | partly |\n"
    assert _rows(results) == {"fade | 0.783 | partly"}
    assert _rows("text\n| fade | 0.783 | partly |\n") & _rows(results)


def _unnamed_machines(folder: Path) -> list[str]:
    """The benchmark pages under ``folder`` whose last line does not name the machine they ran on."""
    bad = []
    for f in sorted(folder.glob("*.md")):
        last = f.read_text().rstrip().splitlines()[-1]
        if not last.startswith("Machine: ") or "not recorded" in last:
            bad.append(f.name)
    return bad


def test_every_benchmark_page_names_the_machine_it_ran_on():
    """A figure the docs include says where it was measured (benchmarks/results_files.py writes the line)."""
    assert _unnamed_machines(REPO / "results" / "benchmarks") == []


def test_the_machine_checker_sees_an_unnamed_machine(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from results_files import machine_line
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    (tmp_path / "named.md").write_text("| a |\n\n" + machine_line({"machine": {
        "cpu": "X", "cores": 2, "torch": "2", "blas": "mkl", "cpu_capability": "AVX2"}}) + "\n")
    (tmp_path / "old.md").write_text("| a |\n\n" + machine_line({}) + "\n")
    (tmp_path / "none.md").write_text("| a |\n")
    assert _unnamed_machines(tmp_path) == ["none.md", "old.md"]


def _site_tools() -> bool:
    return all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"))


@pytest.mark.slow
@pytest.mark.skipif(not _site_tools(), reason="mkdocs, mkdocs-material and mkdocstrings[python] are not installed")
def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                        "-d", str(site)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert (site / "index.html").is_file()
    pages = list(site.rglob("index.html"))
    assert len(pages) >= 10
    # the API pages are generated from docstrings, with Sphinx roles shown as plain code
    train = (site / "api" / "train" / "index.html").read_text()
    assert 'id="circuitfade.train.loop.fit"' in train and ":func:" not in train
    # a study page carries its generated results file, as generated
    cells = [c for row in sorted(_rows((REPO / "results" / "paper" / "results.md").read_text()))
             for c in row.split(" | ") if re.fullmatch(r"\d\.\d+ \[\d\.\d+, \d\.\d+\].*", c)]
    html = (site / "studies" / "paper" / "index.html").read_text()
    assert cells and all(c in html for c in cells[:20])
