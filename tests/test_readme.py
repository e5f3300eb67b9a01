"""Every README code block is checked; this file says exactly how each one is.

The README's fenced ``python`` and ``bash`` blocks are extracted and each command or
block gets one of these treatments (chosen by the rules in :func:`plan`, listed per
block by ``test_every_block_has_a_treatment``):

* ``run``: executed as written - python blocks in a fresh interpreter, shell commands
  through ``circuitfade.cli.main`` / ``python`` - in a scratch folder that holds a link
  to the repository's ``assets/`` (so ``assets/series/...`` paths resolve) and whatever
  earlier blocks wrote there (``runs/fade0`` from the Trajectories block, ...);
* ``tiny``: executed with a small budget appended (``circuitfade train``: ``--steps 20``
  and matching eval/checkpoint intervals; ``circuitfade local-series``: ``--steps 60``),
  because the written command trains for minutes; the rest of the command is as written;
* ``parse``: commands that take minutes to hours (``reproduce``, ``history``, ``demo``,
  ``screen`` of a placeholder path) are only *parsed*: their own argument parser is run
  on the exact arguments written (an unknown flag fails) and stopped before any work;
  ``python -c CODE`` lines of that kind are compiled (syntax only); ``python benchmarks/X.py``
  lines run ``X.py --help`` and check every flag written is listed; ``make`` targets are
  checked with ``make -n`` (they exist; nothing runs);
* ``setup``: commands that build another environment (``python3 -m venv ...``,
  ``.venv*/bin/pip ...``, the TransformerLens-4 install) are not run here: ``make
  test-tl4`` runs exactly that install in CI; this test checks the files they name exist;
* python blocks that use a name defined in prose rather than code (``tokens`` in "The
  model") get a one-line prelude defining it; the prelude is printed in the plan.

The fast test checks extraction, the plan and every ``parse`` item; the slow test runs
every ``run`` and ``tiny`` item in README order.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# names the README's prose defines for a block; the prelude that makes them concrete
PRELUDES = {
    "tokens": "import torch\ntokens = torch.randint(0, 32, (2, 31))  # prelude: the README's 'tokens: int [batch, pos]'\n",
}
# commands that take minutes or hours: parsed only
PARSE_ONLY = ("reproduce", "history", "demo", "alignment", "map")
TINY = {
    "train": ["--steps", "20", "--eval-every", "10", "--checkpoint-every", "10", "--quiet"],
    "local-series": ["--steps", "60", "--quiet"],
}


@dataclass
class Item:
    lang: str  # python | bash
    how: str  # run | tiny | parse
    text: str  # python source, or one shell command
    line: int  # README line of the block
    prelude: str = ""


def blocks(text: str) -> list[tuple[str, str, int]]:
    """``(lang, body, line)`` of every fenced block of ``text``."""
    out, lang, body, start = [], None, [], 0
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^```(\w*)\s*$", line)
        if m and lang is None:
            lang, body, start = m.group(1) or "text", [], i
        elif line.startswith("```") and lang is not None:
            out.append((lang, "\n".join(body), start))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"README.md: unterminated code block at line {start}"
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


def plan(text: str | None = None) -> list[Item]:
    items = []
    for lang, body, line in blocks(README.read_text() if text is None else text):
        if lang == "python":
            names = [n for n in PRELUDES if re.search(rf"\b{n}\b", body) and not re.search(rf"\b{n}\s*=", body)]
            items.append(Item("python", "run", body, line, "".join(PRELUDES[n] for n in names)))
        elif lang in ("bash", "sh", "shell", "console"):
            for cmd in commands(body):
                argv = _strip_comment(cmd)
                if argv[0] == "make":
                    how = "parse"
                elif argv[:3] == ["python3", "-m", "venv"] or re.match(r"\.venv[^/]*/bin/pip$", argv[0]):
                    how = "setup"
                elif argv[0] == "circuitfade" and len(argv) > 1 and argv[1] in TINY:
                    how = "tiny"
                elif argv[0] == "circuitfade" and len(argv) > 1 and argv[1] in PARSE_ONLY:
                    how = "parse"
                elif argv[0] == "circuitfade" and argv[1] == "screen" and not any(
                        a.startswith("runs/") for a in argv[2:]):
                    how = "parse"  # a placeholder path (path/to/series)
                elif argv[0] == "python" and argv[1].startswith("benchmarks/"):
                    how = "parse"  # benchmarks time minutes of training; their flags are checked
                elif argv[0] == "python" and argv[1] == "-c":
                    how = "parse" if "run_sweep" in argv[2] else "run"
                else:
                    how = "run"
                items.append(Item("bash", how, cmd, line))
    return items


class _Parsed(BaseException):
    """Raised right after a successful argument parse, so nothing runs."""


def parse_only(argv: list[str]) -> None:
    """Run the command's own argument parser on ``argv``; stop before it does any work."""
    if argv[0] == "make":
        r = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, f"make -n {argv[1:]}: {r.stderr}"
        return
    if argv[0] == "python" and argv[1].startswith("benchmarks/"):
        r = subprocess.run([sys.executable, str(REPO / argv[1]), "--help"], cwd=REPO, capture_output=True, text=True,
                           env=_env(), timeout=300)
        assert r.returncode == 0, f"{argv[1]} --help: {r.stderr[-2000:]}"
        for flag in (a.split("=")[0] for a in argv[2:] if a.startswith("--")):
            assert flag in r.stdout, f"README runs {argv[1]} with {flag}, which its --help does not list"
        return
    if argv[0] == "python":
        assert argv[1] == "-c", argv
        compile(argv[2], "<README python -c>", "exec")
        return
    assert argv[0] == "circuitfade", argv
    from circuitfade.cli import main

    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        ns = original(self, args, namespace)
        if self.prog.startswith("circuitfade") or "circuitfade" in self.prog:
            raise _Parsed(ns)
        return ns

    mp = pytest.MonkeyPatch()
    mp.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    try:
        with pytest.raises(_Parsed):
            main(argv[1:])
    finally:
        mp.undo()


def test_readme_has_blocks_and_every_block_has_a_treatment(capsys):
    items = plan()
    assert len(items) >= 10
    langs = {lang for lang, _, _ in blocks(README.read_text())}
    assert langs <= {"python", "bash", "text"}, f"README has blocks of kinds this test does not treat: {langs}"
    for it in items:
        print(f"README:{it.line} {it.lang:6} {it.how:5} {it.text.splitlines()[0][:90]}"
              + (f"   [prelude: {it.prelude.strip()}]" if it.prelude else ""))
    hows = {it.how for it in items}
    assert {"run", "tiny", "parse"} <= hows
    # the section this test was written for is executed, not merely parsed
    assert any(it.how == "run" and "torch.save(model.state_dict()" in it.text and it.lang == "python" for it in items)
    assert any(it.how == "run" and "Batch(tokens=tokens" in it.text for it in items)


def test_commands_that_take_minutes_parse_as_written():
    parsed = [it for it in plan() if it.how == "parse"]
    assert parsed
    for it in parsed:
        parse_only(_strip_comment(it.text))


def test_setup_commands_name_files_that_exist():
    setups = [it for it in plan() if it.how == "setup"]
    for it in setups:
        argv = _strip_comment(it.text)
        for flag, value in zip(argv, argv[1:]):
            if flag == "-r":
                assert (REPO / value).is_file(), f"README:{it.line} installs from missing {value}"
    make = subprocess.run(["make", "-n", "test-tl4"], cwd=REPO, capture_output=True, text=True)
    assert not setups or make.returncode == 0, "the README's environment set-up is not exercised by make test-tl4"


def test_parse_only_catches_an_unknown_flag():
    with pytest.raises(SystemExit):
        parse_only(["circuitfade", "reproduce", "--no-such-flag"])
    with pytest.raises(SyntaxError):
        parse_only(["python", "-c", "def ("])


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _run_shell(argv: list[str], cwd: Path, how: str) -> None:
    if argv[0] == "circuitfade":
        argv = [sys.executable, "-m", "circuitfade", *argv[1:]]
        if how == "tiny":
            argv += TINY[argv[3]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    r = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{' '.join(argv)} (exit {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"


@pytest.mark.slow
def test_readme_blocks_run_in_order(tmp_path):
    (tmp_path / "assets").symlink_to(REPO / "assets", target_is_directory=True)
    for it in plan():
        if it.how in ("parse", "setup"):
            continue
        if it.lang == "python":
            script = tmp_path / f"readme_block_{it.line}.py"
            script.write_text("import torch\ntorch.set_num_threads(1)\n" + it.prelude + textwrap.dedent(it.text) + "\n")
            r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True,
                               text=True, timeout=900)
            assert r.returncode == 0, f"README.md line {it.line} (python block) failed:\n{r.stderr[-3000:]}"
        else:
            _run_shell(_strip_comment(it.text), tmp_path, it.how)
