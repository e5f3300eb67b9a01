"""Every code block of the README and of the docs site is checked; this file says exactly how.

The fenced ``python`` and ``bash`` blocks of ``README.md`` and of every page under ``docs/``
are extracted and each command or block gets one of these treatments (chosen by the rules
in :func:`plan`; ``pytest -s -k treatment`` lists every block with its treatment and, for
anything not run, the reason):

* ``run``: executed as written - a page's python blocks in one interpreter, in page
  order, as a reader pastes them into one notebook (a block sees what the blocks above it
  defined), shell commands through ``python -m circuitfade`` / ``python``, each a process of its
  own; both are forked from a warm interpreter that has imported torch, TransformerLens and
  circuitfade (``tests/warm_python.py``: a fresh one spends seconds on that, per page and per
  command) - in a scratch folder per page that stands in
  for a clone's root: it holds read-only links to the repository's ``assets/`` and
  ``circuitfade/data/`` (so ``circuitfade/data/series/...`` paths resolve; ``circuitfade/``
  there is a plain folder, and the package itself is imported from the repository) and whatever
  earlier blocks of the same page wrote there (``runs/my_model`` from the first block of
  "Your own model", ...);
* ``tiny``: executed with a small budget appended (``circuitfade train``: ``--steps 20`` and
  matching eval/checkpoint intervals; ``circuitfade local-series``: ``--steps 60``), because
  the written command trains for minutes; the rest of the command is as written;
* ``parse``: commands that take minutes to hours, download, or write into the repository
  are only *parsed*, each for the reason :data:`PARSE_ONLY` / :func:`plan` gives: their own
  argument parser runs on the exact arguments written (an unknown flag fails) and is
  stopped before any work (``circuitfade demo``, every ``python -m studies...`` command but
  ``--help`` and the few seconds-long ones in :data:`STUDY_RUNS`);
  ``python script.py ...`` lines run ``script.py --help`` and check that every flag written is
  listed; ``python -c CODE`` lines of that kind and python blocks listed in
  :data:`PYTHON_PARSE_ONLY` are compiled (syntax only); ``make`` targets are checked with
  ``make -n``; ``mkdocs build`` is run by ``tests/docs/test_docs.py``;
* ``setup``: commands that build an environment (``python3 -m venv ...``, ``pip install
  ...``) are not run here: ``make test`` / ``make test-tl4`` run exactly those installs in CI;
  this test checks that the files (``-r``) and extras (``.[figures]``) they name exist.

``text`` blocks are shown, not run (equations, sample output); a test checks that none of them
holds a command. Every page runs on both TransformerLens lines. Where the code differs, a page
shows the two routes side by side: a python block whose first line is ``# TransformerLens 3.9``
runs only on 3.9, one whose first line is ``# TransformerLens 4.x`` only on 4.x (:data:`LINE_TAGS`);
a block that uses 3.x's own classes (:data:`TL3_ONLY`) must carry the 3.9 tag, and a page with a
3.9 block has a 4.x block too (fast tests check both), so no page is skipped on either line. The fast tests check extraction, the plan and every ``parse`` item; the slow
test runs every ``run`` and ``tiny`` item, page by page, in page order.
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
import textwrap
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from repo_root import REPO
from warm_python import WarmPython, default_env, warm_python

README = REPO / "README.md"
DOCS = REPO / "docs"


def _rel(f: Path) -> str:
    """``f`` as the pages name it: relative to the repository (a page outside it, in a test, by its name)."""
    return str(f.relative_to(REPO)) if f.is_relative_to(REPO) else f.name


def doc_files() -> list[Path]:
    """The README, then every markdown page of the docs site, in path order."""
    return [README] + sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


# circuitfade subcommands that are only parsed, and why
PARSE_ONLY = {
    "demo": "trains two 3,600-step runs and traces 13 checkpoints (minutes)",
}
STUDY_REASON = "a study: trains for minutes to hours and writes under results/"
# study commands cheap enough to run as written (nothing written, seconds)
STUDY_RUNS = (["studies.alignment.fdt", "anneal"],)
# python blocks that are only compiled: a substring that identifies the block, and why
PYTHON_PARSE_ONLY = {
    "pythia_series(": "downloads Pythia revisions from the Hugging Face hub",
}
TINY = {
    "train": ["--steps", "20", "--eval-every", "10", "--checkpoint-every", "10", "--quiet"],
    "local-series": ["--steps", "60", "--quiet"],
}
LANGS = {"python", "bash", "text"}
# a python block that uses TransformerLens 3.x's own classes (4.x removed them) must be tagged for 3.9
TL3_ONLY = re.compile(r"\bHookedTransformerConfig\b|from transformer_lens import HookedTransformer\b")
# the first line of a python block that runs on one TransformerLens line only -> that line
LINE_TAGS = {"# TransformerLens 3.9": "3.9", "# TransformerLens 4.x": "4.x"}
COMMAND_WORDS = ("circuitfade", "python", "python3", "make", "pip", "mkdocs")


@dataclass
class Item:
    lang: str  # python | bash
    how: str  # run | tiny | parse | setup
    text: str  # python source, or one shell command
    line: int  # line of the block in its file
    file: Path = README
    reason: str = ""
    tl: str | None = None  # "3.9" / "4.x": a python block for that TransformerLens line only (LINE_TAGS)

    @property
    def where(self) -> str:
        return f"{_rel(self.file)}:{self.line}"


def blocks(text: str, name: str = "README.md") -> list[tuple[str, str, int]]:
    """``(lang, body, line)`` of every fenced block of ``text``. A fence must start at column 0
    and name at most a language, so no block can escape this test by being indented or
    decorated."""
    out, lang, body, start = [], None, [], 0
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            assert line.startswith("```"), f"{name}:{i}: indented code fence (write fences at column 0)"
            m = re.match(r"^```(\w*)\s*$", line)
            assert m, f"{name}:{i}: a fence takes a plain language name only, got {line!r}"
            if lang is None:
                lang, body, start = m.group(1) or "text", [], i
            else:
                assert not m.group(1), f"{name}:{i}: a closing fence names a language"
                out.append((lang, "\n".join(body), start))
                lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{name}: unterminated code block at line {start}"
    return out


def commands(body: str) -> list[str]:
    """Shell commands of a bash block: comments dropped, ``\\`` continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    cmds = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        cmds.append(line)
    return cmds


def _strip_comment(cmd: str) -> list[str]:
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def _shell_treatment(argv: list[str]) -> tuple[str, str]:
    """``(how, reason)`` for one shell command."""
    if argv[0] == "make":
        return "parse", "make targets build environments and run suites: checked with make -n"
    if argv[:3] == ["python3", "-m", "venv"] or re.match(r"(\.venv[^/]*/bin/)?pip$", argv[0]):
        return "setup", "builds an environment (run by make test / make test-tl4 in CI)"
    if argv[0] == "mkdocs":
        return "parse", "the site build is tests/docs/test_docs.py::test_the_site_builds_strict"
    if argv[0] == "circuitfade" and len(argv) > 1:
        if argv[1] in TINY:
            return "tiny", ""
        if argv[1] in PARSE_ONLY:
            return "parse", PARSE_ONLY[argv[1]]
        if argv[1] == "screen" and not any(a.startswith(("runs/", "circuitfade/data/")) for a in argv[2:]):
            return "parse", "screens a placeholder path"
        return "run", ""
    if argv[0] == "python" and len(argv) > 2 and argv[1] == "-m" and argv[2].split(".")[0] == "studies":
        cheap = argv[3:] == ["--help"] or argv[2:] in [list(r) for r in STUDY_RUNS]
        return ("run", "") if cheap else ("parse", STUDY_REASON)
    if argv[0] == "python" and len(argv) > 1 and argv[1].endswith(".py"):
        return "parse", "a script that trains for minutes or writes into the repository: its --help lists each flag"
    if argv[0] == "python" and len(argv) > 2 and argv[1] == "-c" and "run_sweep" in argv[2]:
        return "parse", "trains full-length runs: compiled only"
    return "run", ""


def plan(files: list[Path] | None = None) -> list[Item]:
    items = []
    for f in doc_files() if files is None else files:
        for lang, body, line in blocks(f.read_text(), _rel(f)):
            if lang == "python":
                reasons = [r for key, r in PYTHON_PARSE_ONLY.items() if key in body]
                tl = LINE_TAGS.get(body.lstrip().splitlines()[0].strip()) if body.strip() else None
                items.append(Item("python", "parse" if reasons else "run", body, line, f, "; ".join(reasons), tl))
            elif lang == "bash":
                for cmd in commands(body):
                    how, reason = _shell_treatment(_strip_comment(cmd))
                    items.append(Item("bash", how, cmd, line, f, reason=reason))
    return items


class _Parsed(BaseException):
    """Raised right after a successful argument parse, so nothing runs."""


def _stop_after_parse(prog_words: tuple[str, ...]) -> pytest.MonkeyPatch:
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        ns = original(self, args, namespace)
        if any(w in self.prog for w in prog_words):
            raise _Parsed(ns)
        return ns

    mp = pytest.MonkeyPatch()
    mp.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    return mp


def parse_only(argv: list[str]) -> None:
    """Run the command's own argument parser on ``argv``; stop before it does any work."""
    if argv[0] == "make":
        r = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, f"make -n {argv[1:]}: {r.stderr}"
        return
    if argv[0] == "mkdocs":
        assert argv[1] == "build" and (REPO / "mkdocs.yml").is_file(), argv
        return
    if argv[0] == "python" and argv[1].endswith(".py"):
        assert (REPO / argv[1]).is_file(), f"{argv[1]} does not exist"
        r = warm().run([str(REPO / argv[1]), "--help"], REPO, timeout=300)
        assert r.returncode == 0, f"{argv[1]} --help: {r.stderr[-2000:]}"
        for flag in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
            assert flag in r.stdout, f"the docs run {argv[1]} with {flag}, which its --help does not list"
        return
    if argv[0] == "python" and argv[1] == "-c":
        compile(argv[2], "<docs python -c>", "exec")
        return
    if argv[0] == "python" and argv[1] == "-m":
        module = argv[2]
        assert module.split(".")[0] == "studies", argv
        mp = _stop_after_parse(("studies",))
        mp.setattr(sys, "argv", [module, *argv[3:]])
        try:
            with pytest.raises(_Parsed), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # "found in sys.modules": a study module run as main
                runpy.run_module(module, run_name="__main__", alter_sys=False)
        finally:
            mp.undo()
        return
    assert argv[0] == "circuitfade", argv
    from circuitfade.cli import main

    mp = _stop_after_parse(("circuitfade",))
    try:
        with pytest.raises(_Parsed):
            main(argv[1:])
    finally:
        mp.undo()


def test_every_block_has_a_treatment(capsys):
    items = plan()
    assert len(items) >= 40
    for f in doc_files():
        langs = {lang for lang, _, _ in blocks(f.read_text())}
        assert langs <= LANGS, f"{f.relative_to(REPO)} has blocks of kinds this test does not treat: {langs - LANGS}"
    for it in items:
        print(f"{it.where:32} {it.lang:6} {it.how:5} {it.text.splitlines()[0][:80]}"
              + (f"   [{it.reason}]" if it.reason else ""))
    hows = {it.how for it in items}
    assert {"run", "tiny", "parse", "setup"} <= hows
    assert all(it.reason for it in items if it.how in ("parse", "setup")), "every block not run says why"
    # the blocks this test was written for are executed, not merely parsed
    assert any(it.how == "run" and "torch.save(model.state_dict()" in it.text and it.lang == "python" for it in items)
    assert any(it.how == "run" and "Batch(tokens=tokens" in it.text for it in items)
    assert any(it.how == "run" and "head_small_multiples" in it.text and it.file == README for it in items)


def test_text_blocks_hold_no_commands():
    for f in doc_files():
        for lang, body, line in blocks(f.read_text()):
            if lang != "text":
                continue
            for row in body.splitlines():
                first = row.split()[0] if row.split() else ""
                assert first not in COMMAND_WORDS, \
                    f"{f.relative_to(REPO)}:{line}: a command in a text block escapes the block test: {row!r}"


def test_the_fence_checker_refuses_blocks_that_would_escape():
    with pytest.raises(AssertionError, match="indented"):
        blocks("text\n   ```bash\ncircuitfade demo\n   ```\n")
    with pytest.raises(AssertionError, match="plain language"):
        blocks('```python title="x.py"\nprint(1)\n```\n')
    assert blocks("```bash\nmake test\n```\n") == [("bash", "make test", 1)]


def test_commands_that_take_minutes_parse_as_written():
    parsed = [it for it in plan() if it.how == "parse"]
    assert parsed
    for it in parsed:
        if it.lang == "python":
            compile(it.text, it.where, "exec")
        else:
            parse_only(_strip_comment(it.text))


def test_setup_commands_name_files_and_extras_that_exist():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    setups = [it for it in plan() if it.how == "setup"]
    assert setups
    for it in setups:
        argv = _strip_comment(it.text)
        for flag, value in zip(argv, argv[1:]):
            if flag == "-r":
                assert (REPO / value).is_file(), f"{it.where} installs from missing {value}"
        for arg in argv:
            m = re.fullmatch(r"\.\[([\w,-]+)\]", arg)
            if m:
                missing = set(m.group(1).split(",")) - extras
                assert not missing, f"{it.where} installs extras pyproject.toml does not define: {missing}"
    make = subprocess.run(["make", "-n", "test-tl4"], cwd=REPO, capture_output=True, text=True)
    assert make.returncode == 0, "the documented environment set-up is not exercised by make test-tl4"


def test_parse_only_catches_an_unknown_flag():
    with pytest.raises(SystemExit):
        parse_only(["circuitfade", "demo", "--no-such-flag"])
    with pytest.raises(SystemExit):
        parse_only(["python", "-m", "studies.paper", "reproduce", "--no-such-flag"])
    with pytest.raises(SystemExit):
        parse_only(["python", "-m", "studies.removability", "--models", "L9 d1"])
    with pytest.raises(AssertionError, match="--no-such-flag"):
        parse_only(["python", "benchmarks/train_step.py", "--no-such-flag"])
    with pytest.raises(SyntaxError):
        parse_only(["python", "-c", "def ("])


def warm() -> WarmPython:
    """The warm interpreter every page's python interpreter and every ``python``/``circuitfade`` command of a
    page is forked from (tests/warm_python.py)."""
    return warm_python(default_env())


def _run_shell(argv: list[str], cwd: Path, how: str) -> None:
    redirect = None
    if ">" in argv:  # `command > FILE`: the one shell redirection the pages use
        i = argv.index(">")
        assert len(argv) == i + 2, f"{argv}: only a final '> FILE' redirection is supported"
        argv, redirect = argv[:i], argv[i + 1]
    if argv[0] == "circuitfade":
        argv = [sys.executable, "-m", "circuitfade", *argv[1:]]
        if how == "tiny":
            argv += TINY[argv[3]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    r = warm().run(argv[1:], cwd, timeout=900) if argv[0] == sys.executable else \
        subprocess.run(argv, cwd=cwd, env=default_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{' '.join(argv)} (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    if redirect is not None:
        (cwd / redirect).write_text(r.stdout)


def _pages_with_runs() -> list[Path]:
    return [f for f in doc_files() if any(it.how in ("run", "tiny") for it in plan([f]))]


# Runs a page's python blocks in one interpreter: reads block files from stdin, one path a line, executes
# each in one shared namespace and answers on the status pipe (its fd is argv[1]) with one JSON line.
_DRIVER = """
import json, os, sys, traceback
if __name__ == "__main__":
    status = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    ns = {"__name__": "__main__"}
    for path in map(str.strip, sys.stdin):
        try:
            exec(compile(open(path).read(), path, "exec"), ns)
            status.write(json.dumps({"ok": True}) + "\\n")
        except BaseException:
            status.write(json.dumps({"ok": False, "error": traceback.format_exc()[-3000:]}) + "\\n")
"""


class PageInterpreter:
    """One python interpreter for a page: ``run(item)`` executes a block in it and waits for the answer."""

    def __init__(self, folder: Path):
        self.folder = folder
        (folder / "_blocks_driver.py").write_text(_DRIVER)
        self.out = open(folder / "_blocks_output.txt", "w")
        blocks_read, blocks_write = os.pipe()
        read, write = os.pipe()
        try:
            self.pid = warm().popen([str(folder / "_blocks_driver.py"), "{fd:3}"], folder,
                                    [blocks_read, self.out.fileno(), self.out.fileno(), write])
        finally:
            os.close(blocks_read)
            os.close(write)
        self.stdin = os.fdopen(blocks_write, "w")
        self.status = os.fdopen(read)
        self.closed = False

    def run(self, it: Item, timeout: float = 900) -> None:
        import json
        import select

        script = self.folder / f"_block_{it.line}.py"
        script.write_text("import torch\ntorch.set_num_threads(1)\n" + textwrap.dedent(it.text) + "\n")
        self.stdin.write(f"{script}\n")
        self.stdin.flush()
        ready, _, _ = select.select([self.status], [], [], timeout)
        answer = self.status.readline() if ready else ""
        if not answer:
            self.close(kill=True)
            tail = (self.folder / "_blocks_output.txt").read_text()[-3000:]
            raise AssertionError(f"{it.where} (python block): the interpreter "
                                 f"{'timed out' if not ready else 'died'}:\n{tail}")
        answer = json.loads(answer)
        assert answer["ok"], f"{it.where} (python block) failed:\n{answer['error']}"

    def close(self, kill: bool = False) -> None:
        """End the interpreter: its input closed, it finishes (the status pipe reaches its end); killed when
        ``kill`` or when it does not end within a minute."""
        import select

        if self.closed:
            return
        self.closed = True
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        self.stdin.close()
        if not select.select([self.status], [], [], 60)[0]:
            os.kill(self.pid, signal.SIGKILL)
        self.status.read()
        self.out.close()
        self.status.close()


def _this_line() -> str:
    from circuitfade.compat import is_tl4

    return "4.x" if is_tl4() else "3.9"


def test_blocks_of_3x_classes_are_tagged_and_every_page_has_a_4x_route():
    """No page is 3.9-only: a block that uses ``HookedTransformer`` is tagged for 3.9, and its page
    shows the 4.x route beside it."""
    items = [it for it in plan() if it.lang == "python"]
    for it in items:
        if TL3_ONLY.search(it.text):
            assert it.tl == "3.9", f"{it.where}: uses TransformerLens 3.x classes; first line must be '# TransformerLens 3.9'"
    for page in {it.file for it in items if it.tl == "3.9"}:
        assert any(it.file == page and it.tl == "4.x" for it in items), \
            f"{page.relative_to(REPO)}: a 3.9 block without the TransformerLens 4.x route beside it"
    assert {"3.9", "4.x"} <= {it.tl for it in items}  # the own-model pages show both routes


def test_line_tags_are_read_from_the_first_line_only(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```python\n# TransformerLens 4.x\nx = 1\n```\n\n```python\nx = 2  # TransformerLens 3.9\n```\n")
    assert [it.tl for it in plan([page])] == ["4.x", None]


def test_a_page_interpreter_keeps_names_between_blocks_and_reports_the_failing_block(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```python\nx = 41\n```\n\n```python\nassert x == 41\ny = x + 1\n```\n\n"
                    "```python\nraise ValueError(f'boom {y}')\n```\n")
    items = plan([page])
    interpreter = PageInterpreter(tmp_path)
    try:
        interpreter.run(items[0])
        interpreter.run(items[1])
        with pytest.raises(AssertionError, match=r"(?s)p.md:10 .*boom 42"):
            interpreter.run(items[2])
    finally:
        interpreter.close()


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with_runs(), ids=lambda p: str(p.relative_to(REPO)))
def test_blocks_run_in_order(page, tmp_path):
    items = plan([page])
    line = _this_line()
    (tmp_path / "assets").symlink_to(REPO / "assets", target_is_directory=True)
    (tmp_path / "circuitfade").mkdir()
    (tmp_path / "circuitfade" / "data").symlink_to(REPO / "circuitfade" / "data", target_is_directory=True)
    interpreter = None
    try:
        for it in items:
            if it.how in ("parse", "setup") or (it.tl is not None and it.tl != line):
                continue
            if it.lang == "python":
                interpreter = interpreter or PageInterpreter(tmp_path)
                interpreter.run(it)
            else:
                _run_shell(_strip_comment(it.text), tmp_path, it.how)
    finally:
        if interpreter is not None:
            interpreter.close()


def test_the_warm_interpreter_runs_a_command_as_a_fresh_one_does(tmp_path):
    """What the forked child claims to share with a fresh ``python``: torch's first random draws, argv,
    working folder, environment, ``__main__``, exit codes, both streams and the exit handlers."""
    (tmp_path / "prog.py").write_text(
        "import atexit, os, sys, torch\n"
        "atexit.register(lambda: print('bye', flush=True))\n"
        "print(torch.rand(3).tolist(), sys.argv[1:], os.getcwd(), os.environ.get('WARM_TEST'), __name__)\n"
        "print('to stderr', file=sys.stderr)\n"
        "sys.exit(int(sys.argv[1]))\n")
    env = {**default_env(), "WARM_TEST": "yes"}
    fresh = subprocess.run([sys.executable, "prog.py", "3"], cwd=tmp_path, env=env, capture_output=True, text=True)
    forked = [warm_python(env).run(["prog.py", "3"], tmp_path, timeout=300, env=env) for _ in range(2)]
    for r in [fresh, *forked]:  # the first line: three random numbers, then what must be equal
        assert r.returncode == 3 and r.stderr == "to stderr\n"
        assert r.stdout.split("] ", 1)[1] == fresh.stdout.split("] ", 1)[1]
    assert forked[0].stdout != forked[1].stdout  # torch seeded afresh in each, as in two fresh processes
    assert fresh.stdout.endswith("bye\n") and str(tmp_path) in fresh.stdout and "yes __main__" in fresh.stdout
    failed = warm_python(env).run(["-c", "raise ValueError('planted')"], tmp_path, timeout=300, env=env)
    assert failed.returncode == 1 and failed.stderr.splitlines()[-1] == "ValueError: planted"
    assert "_child" not in failed.stderr  # the traceback starts at the program, as a fresh one's does
    module = warm_python(env).run(["-m", "circuitfade", "--no-such-command"], tmp_path, timeout=300, env=env)
    assert module.returncode == 2 and module.stderr.startswith("circuitfade: error: ")
