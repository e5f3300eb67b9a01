"""A study's output folder is one unit (:mod:`studies.common`): a failed or interrupted run
leaves the previous complete set (or no folder), never a mix of two runs' files; its message
says where the run's files are and what to run next, truthfully; the same command resumes;
nothing the user wrote is lost. Planted on a small study and on the development study."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from circuitfade.io import check_outputs, write_text
from circuitfade.train import RunLocked
from studies.common import StudyOutputs, study_folder, study_main
from repo_root import REPO, TESTS

HERE = Path(__file__).resolve().parent

PROG = "python -m studies.planted"


class Stop(Exception):
    pass


STOP = {"after": -1, "how": "interrupt"}
"""Where :func:`planted_main` stops: after this many result files (-1: it does not), by Ctrl-C
(``interrupt``) or a full disk (``disk``); outside the command line, so a rerun is the same command."""


def planted_main(argv: list[str]) -> int:
    """A study: ``--tag`` goes into every file; it stops where :data:`STOP` says;
    ``run/state.txt`` is its resumable work (it says whether it found it there)."""
    ap = argparse.ArgumentParser(prog=PROG)
    ap.add_argument("--out", default="results/planted")
    ap.add_argument("--tag", default="a")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--force", action="store_true")
    ns = ap.parse_args(argv)
    out = Path(ns.out)
    names = ["table1.csv", "table2.csv", "results.md"]
    check_outputs([out / n for n in names], force=ns.force)  # creates OUT, as the studies' checks do
    if ns.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {ns.workers}")
    state = out / "run" / "state.txt"
    write_text(state, f"{'resumed' if state.is_file() else 'trained'} {ns.tag}")
    for i, name in enumerate(names):
        if i == STOP["after"]:
            if STOP["how"] == "disk":
                raise OSError(28, "No space left on device", str(out / name))
            raise KeyboardInterrupt
        write_text(out / name, f"{ns.tag} {name}")
    return 0


def files(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture()
def out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(STOP, "after", -1)
    monkeypatch.setitem(STOP, "how", "interrupt")
    return tmp_path / "results" / "planted"


def run(out: Path, *args: str, stop_after: int = -1, how: str = "interrupt") -> int:
    STOP.update(after=stop_after, how=how)
    try:
        return study_main(PROG, planted_main, [*args, "--out", str(out)])
    finally:
        STOP.update(after=-1, how="interrupt")


def test_an_interrupted_forced_rerun_leaves_the_previous_complete_set(out, capsys):
    assert run(out, "--tag", "a") == 0
    (out / "notes.txt").write_text("mine")  # the user's own file
    before = files(out)
    capsys.readouterr()
    assert run(out, "--tag", "b", "--force", stop_after=2) == 130  # killed after the tables
    err = capsys.readouterr().err
    assert files(out) == before  # the previous set, whole: no b table beside the a results.md
    kept = study_folder(out) / "interrupted"
    assert files(kept)["table1.csv"] == "b table1.csv"
    assert len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err and str(out) in err and str(kept) in err and "run the same command again" in err
    assert not (study_folder(out) / "previous").exists()


def test_the_same_command_resumes_from_the_interrupted_run(out, capsys):
    """The message's advice works: the same command runs (its tables do not make it refuse) and
    carries over the interrupted run's work (its sub-folders)."""
    assert run(out, stop_after=1) == 130
    assert not out.exists()  # no previous results: no folder, rather than half of one
    assert "was not created" in capsys.readouterr().err
    assert run(out, stop_after=1) == 130  # again: still resumable
    assert run(out) == 0
    assert files(out) == {"results.md": "a results.md", "run/state.txt": "resumed a",
                          "table1.csv": "a table1.csv", "table2.csv": "a table2.csv"}
    assert not study_folder(out).exists()  # nothing left aside


def test_a_failed_run_is_put_back_and_says_so_after_its_error(out, capsys):
    assert run(out, "--tag", "a") == 0
    before = files(out)
    capsys.readouterr()
    assert run(out, "--tag", "b", "--force", stop_after=1, how="disk") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "No space left" in lines[0] and "previous complete results" in lines[1]
    assert files(out) == before


def test_another_command_does_not_take_an_interrupted_runs_files(out, capsys):
    assert run(out, "--tag", "a", stop_after=1) == 130
    assert run(out, "--tag", "b") == 0
    assert files(out)["table1.csv"] == "b table1.csv"  # not resumed from the a run
    assert "holds an interrupted run" in capsys.readouterr().err
    assert (study_folder(out) / "interrupted" / "run" / "state.txt").read_text() == "trained a"


def test_a_run_that_writes_nothing_leaves_no_folder_and_no_trace(out, capsys):
    assert run(out, "--workers", "0") == 2  # a bad argument, found after the output check made OUT
    assert not out.exists() and not study_folder(out).exists()
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert run(out) == 0
    before = files(out)
    assert run(out) == 2  # the outputs exist: --force needed; nothing touched
    assert files(out) == before and not study_folder(out).exists()


def test_one_command_writes_a_folder_at_a_time(out):
    first = StudyOutputs(out, "one")
    first.begin()
    with pytest.raises(RunLocked, match="is being written by another study command"):
        StudyOutputs(out, "two").begin()
    first.end(ok=True)
    second = StudyOutputs(out, "two")
    second.begin()
    second.end(ok=True)


KILLED = """
import os, signal, sys
from pathlib import Path
sys.path[:0] = {paths!r}  # this file's folder and tests/ (its helpers)
from test_study_outputs import planted_main
from circuitfade.io import write_text
from studies.common import study_main

def main(argv):
    planted_main(argv)  # every file written
    os.kill(os.getpid(), signal.SIGKILL)  # then killed outright, before the run could end

study_main("python -m studies.planted", main, ["--tag", "b", "--force", "--out", {out!r}])
"""


def test_a_run_killed_outright_is_put_back_by_the_next_command(out, capsys):
    assert run(out, "--tag", "a") == 0
    before = files(out)
    code = subprocess.run([sys.executable, "-c", KILLED.format(paths=[str(HERE), str(TESTS)], out=str(out))],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}).returncode
    assert code == -9
    assert files(out)["table1.csv"] == "b table1.csv"  # on disk: the killed run's files...
    assert (study_folder(out) / "run.json").is_file()  # ...and the record that flags them
    capsys.readouterr()
    assert run(out, "--tag", "a") == 2  # the next command first puts the previous set back...
    err = capsys.readouterr().err
    assert "was cut short" in err and "previous complete results" in err
    assert files(out) == before  # ...then refuses as it would have: the outputs exist
    assert files(study_folder(out) / "interrupted")["table1.csv"] == "b table1.csv"


# --------------------------------------------------------------------------------------
# the development study
# --------------------------------------------------------------------------------------
COMMITTED = REPO / "results" / "development"


def _dev(argv):
    from studies.development.study import main

    return study_main("python -m studies.development", main, argv)


def _screen_stub(stop_after_tables: bool):
    """``screens.run`` writing the committed tables, then (optionally) Ctrl-C before returning."""
    from circuitfade.commands.screen import TABLES

    def run(source, out, n, progress):
        tables = {t: pd.read_csv(COMMITTED / f"{t}.csv") for t in TABLES}
        (Path(out) / "runs" / "local-series").mkdir(parents=True, exist_ok=True)
        write_text(Path(out) / "runs" / "local-series" / "config.json", "{}")
        for t, df in tables.items():
            write_text(Path(out) / f"{t}.csv", df.to_csv(index=False))
        if stop_after_tables:
            raise KeyboardInterrupt
        write_text(Path(out) / "report.html", "<html></html>")
        return tables

    return run


def test_development_interrupted_after_its_tables_keeps_the_old_results_whole(tmp_path, monkeypatch, capsys):
    import shutil

    import studies.development.study as dev

    out = tmp_path / "development"
    shutil.copytree(COMMITTED, out)
    (out / "screen.csv").write_text("old screen\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(dev, "run", _screen_stub(stop_after_tables=True))
    assert _dev(["--series", str(tmp_path), "--n", "3", "--force", "--no-png", "--quiet", "--out", str(out)]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no new screen.csv beside the old results.md
    assert "run the same command again" in capsys.readouterr().err


def test_development_resumes_with_the_same_command_after_an_interrupt(tmp_path, monkeypatch, capsys):
    import studies.development.study as dev

    out = tmp_path / "development"
    argv = ["--series", str(tmp_path), "--n", "3", "--no-png", "--quiet", "--out", str(out)]
    monkeypatch.setattr(dev, "run", _screen_stub(stop_after_tables=True))
    assert _dev(argv) == 130
    err = capsys.readouterr().err
    assert "run the same command again" in err
    monkeypatch.setattr(dev, "run", _screen_stub(stop_after_tables=False))
    assert _dev(argv) == 0, capsys.readouterr().err  # the advice holds: no table makes it refuse
    assert (out / "results.md").is_file() and (out / "report.html").is_file()
    assert (out / "runs" / "local-series" / "config.json").is_file()


def test_development_with_a_bad_series_leaves_no_empty_results_folder(tmp_path, capsys):
    out = tmp_path / "results" / "development"
    assert _dev(["--series", str(tmp_path / "nowhere"), "--quiet", "--out", str(out)]) == 2
    assert not out.exists() and not study_folder(out).exists()  # (the output check had made it)


def test_development_tables_only_through_the_command_rebuilds_the_committed_results(tmp_path):
    import shutil

    from circuitfade.commands.screen import TABLES

    for t in TABLES:
        shutil.copy(COMMITTED / f"{t}.csv", tmp_path / f"{t}.csv")
    assert _dev(["--tables-only", "--no-png", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "results.md").read_text()
    assert text.replace(f" --out {tmp_path}", "") == (COMMITTED / "results.md").read_text()
    assert not study_folder(tmp_path).exists()


class Parsed(Exception):
    pass


def test_a_caller_that_stops_after_parsing_starts_no_unit(out, monkeypatch):
    """A command stopped right after its arguments are parsed (as the docs' parse-only check does)
    writes nothing, so it takes no snapshot and no lock: a run in progress does not block it."""
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    holder = StudyOutputs(out, "another")
    holder.begin()
    try:
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
        with pytest.raises(Parsed):
            run(out)
    finally:
        holder.end(ok=True)
