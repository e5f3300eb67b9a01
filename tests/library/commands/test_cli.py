"""The CLI entry points the README names: train, demo (tiny budgets)."""

from __future__ import annotations

import pytest

from circuitfade.cli import main
from circuitfade.train import read_metrics


def test_train_writes_a_run(tmp_path, capsys):
    out = tmp_path / "r"
    rc = main(["train", "--path", "fade5+5->0", "--steps", "20", "--eval-every", "10", "--checkpoint-every", "10",
               "--out", str(out), "--quiet"])
    assert rc == 0
    m = read_metrics(out)
    assert list(m.step) == [0, 10, 20] and m.gate_pos.iloc[-1] == 0.0
    assert "acc_zero" in capsys.readouterr().out


def test_train_linreg_reports_its_primary_metric(tmp_path, capsys):
    """A regression task trains and is summarised by its primary metric (MSE), not acc_* keys."""
    out = tmp_path / "lr"
    rc = main(["train", "--task", "linreg", "--path", "unforced", "--steps", "4", "--eval-every", "2",
               "--checkpoint-every", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "mse_normal" in printed and "acc_normal" not in printed
    m = read_metrics(out)
    value = float(printed.split("mse_normal")[1].split()[0])
    assert value == pytest.approx(m["mse_normal"].iloc[-1], abs=5e-4)


def test_bad_path_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "--path", "fade-nowhere", "--out", str(tmp_path / "x")]) == 2
    assert "fade" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_prints_both_paths_and_says_when_the_fade_never_happened(tmp_path, capsys):
    assert main(["demo", "--steps", "10", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| unforced |" in out and "| fade600->0 |" in out
    # 10 steps: the fade's gate is still 0.50, and the footnote says the comparison did not happen
    assert "| 0.50 |" in out and "gate is still 0.50 at step 10" in out and "not the paper's comparison" in out
    # the HTML report of the fade run, written into the demo folder, and its path printed
    report = tmp_path / "fade600to0_report.html"
    assert f"report: {report.resolve()}" in out and "Consolidation timeline" in report.read_text()


@pytest.mark.slow
def test_demo_shows_progress_for_both_runs(tmp_path, capfd):
    assert main(["demo", "--steps", "10", "--out", str(tmp_path), "--no-report"]) == 0
    err = capfd.readouterr().err
    assert "unforced: 100%" in err and "fade600->0: 100%" in err and "10/10 steps" in err
    assert not (tmp_path / "fade600to0_report.html").exists()
    # the table and the command, written for the docs to include; a file the demo did not write is kept
    summary = (tmp_path / "demo.md").read_text()
    assert f"`circuitfade demo --steps 10 --out {tmp_path} --no-report`" in summary
    assert "| unforced |" in summary and "| fade600->0 |" in summary and "gate is still 0.50" in summary
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    capfd.readouterr()
    assert main(["demo", "--steps", "10", "--out", str(tmp_path), "--no-report", "--summary", str(mine)]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("circuitfade demo: error: ") and "not written by the demo" in err and "--summary" in err
    assert len(err.splitlines()) == 1 and mine.read_text() == "my notes\n"


def test_the_program_exits_with_mains_code_and_leaves_its_objects_to_the_exit(monkeypatch):
    """``run`` (``python -m circuitfade``, the ``circuitfade`` script) exits with ``main``'s code, after
    freezing the garbage collector's objects (so the interpreter's exit does not search them for
    cycles); a code of 0 and a failing one both pass through."""
    import gc

    import circuitfade.cli as cli

    for code in (0, 2):
        monkeypatch.setattr(cli, "main", lambda code=code: code)
        gc.unfreeze()
        try:
            with pytest.raises(SystemExit) as e:
                cli.run()
            assert e.value.code == code and gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()  # this test process goes on collecting


def test_the_training_commands_import_with_the_collector_paused(tmp_path, monkeypatch):
    """``import_collector_paused`` imports with the garbage collector off and leaves it as it found it
    (on stays on, off stays off); the training commands import the trainer that way."""
    import gc
    import sys

    import circuitfade.cli as cli

    (tmp_path / "planted_import.py").write_text("import gc\nCOLLECTING = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for enabled in (True, False):
        sys.modules.pop("planted_import", None)
        (gc.enable if enabled else gc.disable)()
        try:
            assert cli.import_collector_paused("planted_import").COLLECTING is False
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
    seen = []
    monkeypatch.setattr(cli, "import_collector_paused", seen.append)
    monkeypatch.setattr(cli, "cmd_train", lambda ns: 0)
    assert cli.main(["train", "--steps", "2"]) == 0 and seen == ["circuitfade.train"]
