"""The CLI on bad input: one line naming the problem, exit code 2, no traceback; outputs never
overwritten without --force; task arguments parsed against the task's config fields."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import circuitfade.train.loop as training
from circuitfade.cli import _task_dict, build_parser, main
from circuitfade.train import RunConfig, TrainConfig, train

QUICK = ["--steps", "4", "--eval-every", "2", "--checkpoint-every", "2", "--quiet"]


def one_line_error(capsys, *must):
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for m in must:
        assert m in err, err
    return err


@pytest.fixture()
def tiny_run(tmp_path):
    d = tmp_path / "run"
    train(RunConfig(path="fade2+2->0", train=TrainConfig(steps=4, eval_every=2, checkpoint_every=2, eval_size=32,
                                                         batch_size=8)), d, progress=False)
    return d


# --------------------------------------------------------------------------------------
# 14. every user error: one line, exit 2
# --------------------------------------------------------------------------------------
def test_held_lock_is_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--path", "unforced", "--out", str(out), *QUICK]) == 0
    (out / "done.json").unlink()
    (out / ".lock").write_text(str(os.getppid()))  # a live process that is not us
    capsys.readouterr()
    assert main(["train", "--path", "unforced", "--out", str(out), *QUICK]) == 2
    one_line_error(capsys, "being trained by process")


def test_out_pointing_at_a_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("mine")
    assert main(["train", "--out", str(f), *QUICK]) == 2
    one_line_error(capsys, str(f), "not a directory")
    assert f.read_text() == "mine"


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "No space left"), (errno.EROFS, "Read-only"),
                                         (errno.EACCES, "Permission denied")])
def test_disk_full_and_read_only_are_one_line(tmp_path, capsys, monkeypatch, code, words):
    def fail(path, *a, **k):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(training, "write_json", fail)
    assert main(["train", "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, words, "config.json")


@pytest.mark.parametrize("model, words", [("{n_heads: 0}", "--model"), ('{"n_heads": 0}', "n_heads"),
                                          ("[1, 2]", "--model"), ('{"d_vocab": 8}', "d_vocab")])
def test_bad_model_json_is_one_line(tmp_path, capsys, model, words):
    assert main(["train", "--model", model, "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, words)
    assert not (tmp_path / "r").exists()


def test_huge_seed_is_one_line(tmp_path, capsys):
    assert main(["train", "--seed", str(2**64), "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, "seed")


def test_continuation_without_parent_is_one_line(tmp_path, capsys):
    assert main(["train", "--path", "posthoc2550", "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, "parent")


def test_sigint_says_the_run_can_be_resumed(tmp_path, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "fit", interrupted)
    assert main(["train", "--out", str(tmp_path / "r"), *QUICK]) == 130
    one_line_error(capsys, "same command", "resume")


def test_delegated_command_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import circuitfade.viz.report as report

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "x.html")

    monkeypatch.setattr(report, "analyze", disk_full)
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "o" / "a.html"), "--quiet"]) == 2
    one_line_error(capsys, "No space left")


# --------------------------------------------------------------------------------------
# 15. --task-arg parsed against the task's config fields
# --------------------------------------------------------------------------------------
def test_task_args_follow_the_config_field_types():
    d = _task_dict("repeats", ["score=first", "max_gap=None", "min_span=4", "skip_p=0.25", "bos=false"])
    assert d == {"name": "repeats", "score": "first", "max_gap": None, "min_span": 4, "skip_p": 0.25, "bos": False}
    assert _task_dict("repeats", ["max_gap=3"])["max_gap"] == 3
    assert _task_dict("assoc", ["query_position=first"])["query_position"] == "first"


@pytest.mark.parametrize("arg, words", [("name=true", "name"), ("n_pairs=two", "n_pairs"), ("n_pairs=2.5", "n_pairs"),
                                        ("bogus=1", "bogus"), ("n_pairs", "KEY=VALUE"), ("n_pairs=None", "n_pairs"),
                                        ("shared_vocab=maybe", "shared_vocab")])
def test_bad_task_args_are_one_line(tmp_path, capsys, arg, words):
    assert main(["train", "--task-arg", arg, "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, words)


def test_flag_defaults_come_from_train_config():
    """Unset flags are left to TrainConfig (no default is copied into the parser)."""
    from circuitfade.cli import _train_kwargs

    names = ("steps", "eval_every", "checkpoint_every", "device")
    ns = build_parser().parse_args(["train"])
    assert TrainConfig(**_train_kwargs(ns, *names)) == TrainConfig()
    ns = build_parser().parse_args(["train", "--steps", "7", "--eval-every", "7"])
    assert TrainConfig(**_train_kwargs(ns, *names)) == TrainConfig(steps=7, eval_every=7)


def test_local_series_refuses_zero_steps(capsys):
    assert main(["local-series", "--steps", "0"]) == 2
    one_line_error(capsys, "--steps")


# --------------------------------------------------------------------------------------
# 10, 12: outputs never overwritten without --force; checked before computing
# --------------------------------------------------------------------------------------
def test_screen_refuses_to_overwrite_tables(tiny_run, tmp_path, capsys, monkeypatch):
    import circuitfade.viz.screens as dev

    d = tmp_path / "d"
    d.mkdir()
    (d / "integrity.csv").write_text("mine")
    monkeypatch.setattr(dev, "run", lambda *a, **k: pytest.fail("computed before checking the outputs"))
    assert main(["screen", str(tiny_run), "--out", str(d / "report.html"), "--quiet"]) == 2
    one_line_error(capsys, "integrity.csv", "--force")
    assert (d / "integrity.csv").read_text() == "mine"


def test_screen_and_analyze_default_outside_the_source(tiny_run, tmp_path, monkeypatch):
    import circuitfade.viz.screens as dev
    import circuitfade.viz.report as report

    seen = {}
    monkeypatch.chdir(tmp_path)

    def record(name):
        def stub(src, out, **k):
            seen[name] = Path(out)
            raise ValueError("stub: stop here")  # (the real work is tested elsewhere)
        return stub

    monkeypatch.setattr(dev, "run", record("screen"))
    monkeypatch.setattr(report, "analyze", record("analyze"))
    assert main(["screen", str(tiny_run), "--quiet"]) == 2
    assert main(["analyze", str(tiny_run), "--quiet"]) == 2
    folder = seen["screen"]
    assert tiny_run.resolve() not in folder.resolve().parents and folder.resolve() != tiny_run.resolve()
    assert tiny_run.resolve() not in seen["analyze"].resolve().parents
    assert not (tiny_run / "analysis.html").exists() and not (tiny_run / "screen.html").exists()


def test_analyze_checks_the_output_before_tracing(tiny_run, tmp_path, capsys, monkeypatch):
    import circuitfade.viz.report as report

    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a folder should be")
    monkeypatch.setattr(report, "analyze", lambda *a, **k: pytest.fail("traced before checking the output"))
    assert main(["analyze", str(tiny_run), "--out", str(blocker / "a.html"), "--quiet"]) == 2
    one_line_error(capsys, "blocker")
    existing = tmp_path / "a.html"
    existing.write_text("mine")
    assert main(["analyze", str(tiny_run), "--out", str(existing), "--quiet"]) == 2
    one_line_error(capsys, "--force")
    assert existing.read_text() == "mine"


def _paper(argv):
    from studies.common import study_main
    from studies.paper.cli import main as paper_main

    return study_main("python -m studies.paper", paper_main, argv)


def test_reproduce_never_overwrites_committed_results_without_force(tmp_path, capsys, monkeypatch):
    import studies.paper.reproduce as rep

    seen = {}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "paper").mkdir(parents=True)
    (tmp_path / "results" / "paper" / "results.md").write_text("committed")
    monkeypatch.setattr(rep, "reproduce", lambda *a, **k: seen.update(k) or {"markdown": ""})
    assert _paper(["reproduce", "controls", "--tables-only"]) == 2  # the default OUT holds results
    one_line_error(capsys, "results.md", "--force")
    assert not seen
    assert _paper(["reproduce", "controls", "--tables-only", "--force"]) == 0
    assert Path(seen["out"]) == Path("results/paper")
    assert (tmp_path / "results" / "paper" / "results.md").read_text() == "committed"  # (the stub wrote nothing)


def test_reproduce_refuses_a_missing_runs_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _paper(["reproduce", "controls", "--tables-only", "--runs", str(tmp_path / "nope"), "--out", "o"]) == 2
    one_line_error(capsys, "--runs")
    assert not (tmp_path / "o").exists()
