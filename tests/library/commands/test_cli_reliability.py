"""The CLI on bad input: one line naming the problem, exit code 2, no traceback; outputs never
overwritten without --force; task arguments parsed against the task's config fields."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

import circuitfade.train.loop as training
import circuitfade.train.rundir as rundir
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
    import fcntl

    out = tmp_path / "r"
    assert main(["train", "--path", "unforced", "--out", str(out), *QUICK]) == 0
    (out / "done.json").unlink()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)  # another trainer holds the run's lock
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"4242")
    capsys.readouterr()
    try:
        assert main(["train", "--path", "unforced", "--out", str(out), *QUICK]) == 2
    finally:
        os.close(fd)
    one_line_error(capsys, "being trained by process 4242")


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

    monkeypatch.setattr(rundir, "write_json", fail)
    assert main(["train", "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, words, "config.json")


@pytest.mark.parametrize("model, words", [("{n_heads: 0}", "--model"), ('{"n_heads": 0}', "n_heads"),
                                          ("[1, 2]", "--model"), ('{"d_vocab": 8}', "d_vocab"),
                                          ('{"dtype": "float16"}', "float16"), ('{"dtype": "bfloat16"}', "bfloat16"),
                                          ('{"dtype": "int64"}', "int64"),
                                          ('{"d_mlp": -3, "attn_only": false}', "d_mlp"),
                                          ('{"device": "meta"}', "meta")])
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


@pytest.fixture()
def sigint_restored():
    """main() leaves a quiet-exit SIGINT handler behind after an interrupt (the process is
    ending); this test process is not, so the handler is put back."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


def test_sigint_says_the_run_can_be_resumed(tmp_path, capsys, monkeypatch, sigint_restored):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "fit", interrupted)
    assert main(["train", "--out", str(tmp_path / "r"), *QUICK]) == 130
    one_line_error(capsys, "same command", "resume")


def test_sigint_during_analyze_does_not_promise_a_resume(tiny_run, tmp_path, capsys, monkeypatch, sigint_restored):
    import circuitfade.commands.analyze as report

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "analyze", interrupted)
    assert main(["analyze", str(tiny_run), "--out", str(tmp_path / "o" / "a.html"), "--quiet"]) == 130
    err = one_line_error(capsys, "circuitfade analyze: interrupted")
    assert "run the same command again to resume" not in err and "checkpoints are kept" not in err


def test_sigint_during_screen_does_not_promise_a_resume(tiny_run, tmp_path, capsys, monkeypatch, sigint_restored):
    import circuitfade.commands.screen as screens

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(screens, "run", interrupted)
    assert main(["screen", str(tiny_run), "--out", str(tmp_path / "s" / "screen.html"), "--quiet"]) == 130
    err = one_line_error(capsys, "circuitfade screen: interrupted")
    assert "resume" not in err


def test_delegated_command_errors_are_one_line(tmp_path, capsys, monkeypatch):
    import circuitfade.commands.analyze as report

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
    import circuitfade.commands.screen as dev

    d = tmp_path / "d"
    d.mkdir()
    (d / "integrity.csv").write_text("mine")
    monkeypatch.setattr(dev, "run", lambda *a, **k: pytest.fail("computed before checking the outputs"))
    assert main(["screen", str(tiny_run), "--out", str(d / "report.html"), "--quiet"]) == 2
    one_line_error(capsys, "integrity.csv", "--force")
    assert (d / "integrity.csv").read_text() == "mine"


def test_screen_and_analyze_default_outside_the_source(tiny_run, tmp_path, monkeypatch):
    import circuitfade.commands.screen as dev
    import circuitfade.commands.analyze as report

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
    import circuitfade.commands.analyze as report

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


# --------------------------------------------------------------------------------------
# counts that would start no work, or work the user did not ask for
# --------------------------------------------------------------------------------------
def _study(prog, main_fn, argv):
    from studies.common import study_main

    return study_main(prog, main_fn, argv)


@pytest.mark.parametrize("study, flag, value", [
    ("alignment", "--workers", "0"), ("alignment", "--workers", "-2"), ("history", "--threads", "0"),
    ("static", "--workers", "0"), ("removability", "--workers", "0"), ("reproduce", "--workers", "0"),
    ("reproduce", "--large-seeds", "-1"),
])
def test_study_counts_below_one_start_no_work(tmp_path, capsys, monkeypatch, study, flag, value):
    import studies.alignment.report as alignment
    import studies.history.study as history
    import studies.paper.reproduce as reproduce
    import studies.paper.static_baselines as static
    import studies.removability.map as removability

    monkeypatch.chdir(tmp_path)

    def started(*a, **k):
        pytest.fail("work started")

    for module, name in [(alignment, "run"), (history, "run"), (static, "run"), (removability, "run_sweep"),
                         (reproduce, "reproduce")]:
        monkeypatch.setattr(module, name, started)
    mains = {"alignment": alignment.main, "history": history.main, "static": static.main,
             "removability": removability.main, "reproduce": reproduce.main}
    assert _study("python -m studies." + study, mains[study], [flag, value, "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, flag, value)
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------------------
# train --config FILE: a RunConfig from a file, command-line flags on top
# --------------------------------------------------------------------------------------
RUN_FILE = {"path": "unforced", "task": {"name": "assoc", "n_pairs": 3}, "model": {"n_layers": 1},
            "train": {"steps": 4, "eval_every": 2, "checkpoint_every": 2, "lr": 0.002, "batch_size": 8,
                      "eval_size": 32}, "seed": 7}


def _printed(capsys, argv) -> dict:
    capsys.readouterr()
    assert main(["train", *argv, "--print-config"]) == 0
    return json.loads(capsys.readouterr().out)


def test_train_reads_a_config_file_and_flags_override_it(tmp_path, capsys):
    f = tmp_path / "run.json"
    f.write_text(json.dumps(RUN_FILE))
    d = _printed(capsys, ["--config", str(f)])
    assert RunConfig.from_dict(d) == RunConfig.from_dict(RUN_FILE)
    d = _printed(capsys, ["--config", str(f), "--seed", "8", "--steps", "6", "--model", '{"d_model": 32}',
                          "--task-arg", "n_keys=5", "--path", "fade2->0"])
    assert d["seed"] == 8 and d["path"] == "fade2->0"
    assert d["train"]["steps"] == 6 and d["train"]["lr"] == 0.002 and d["train"]["batch_size"] == 8
    assert d["model"] == {"n_layers": 1, "d_model": 32}
    assert d["task"] == {"name": "assoc", "n_pairs": 3, "n_keys": 5}
    assert _printed(capsys, ["--config", str(f), "--task", "markov"])["task"] == {"name": "markov"}
    out = tmp_path / "r"
    assert main(["train", "--config", str(f), "--out", str(out), "--quiet"]) == 0
    assert RunConfig.from_dict(json.loads((out / "config.json").read_text())) == RunConfig.from_dict(RUN_FILE)


def test_train_reads_a_yaml_config_file(tmp_path, capsys, monkeypatch):
    import sys

    f = tmp_path / "run.yaml"
    f.write_text("path: unforced\nseed: 7\ntrain:\n  steps: 4\n  lr: 0.002\n")
    try:
        import yaml  # noqa: F401
    except ImportError:
        pass
    else:
        d = _printed(capsys, ["--config", str(f)])
        assert d["path"] == "unforced" and d["seed"] == 7 and d["train"]["lr"] == 0.002
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML not installed
    assert main(["train", "--config", str(f), "--print-config"]) == 2
    one_line_error(capsys, "run.yaml", "PyYAML")


@pytest.mark.parametrize("content, words", [
    (None, ["no such file"]),
    ("{not json", ["not valid JSON", "line 1"]),
    ("[1, 2]", ["expected an object"]),
    ('{"pth": "unforced"}', ["unknown run config fields", "pth"]),
    ('{"train": {"lrr": 0.1}}', ["unknown TrainConfig fields", "lrr"]),
    ('{"train": {"lr": -1}}', ["lr"]),
    ('{"model": {"dtype": "float16"}}', ["float16"]),
    ('{"task": "assoc"}', ["'task' must be an object"]),
])
def test_bad_config_files_are_one_line_naming_the_file(tmp_path, capsys, content, words):
    f = tmp_path / "run.json"
    if content is not None:
        f.write_text(content)
    assert main(["train", "--config", str(f), "--out", str(tmp_path / "r"), *QUICK]) == 2
    one_line_error(capsys, "run.json", *words)
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------------------------------
# the command line speaks its own syntax
# --------------------------------------------------------------------------------------
def _walk(parser, prog="circuitfade"):
    """Every (command, parser) below ``parser``: the built-in subcommands and the delegated ones
    (their parsers live in their own modules)."""
    import argparse
    import importlib

    from circuitfade.cli import DELEGATED

    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name in DELEGATED:
                    module, _, _ = DELEGATED[name]
                    sub = importlib.import_module(module).build_parser(f"{prog} {name}")
                yield from _walk(sub, f"{prog} {name}")


def test_every_command_and_option_has_help_text():
    import argparse

    seen = set()
    for prog, parser in _walk(build_parser()):
        seen.add(prog)
        assert (parser.description or "").strip() or prog == "circuitfade", f"{prog}: no description"
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            assert (action.help or "").strip(), f"{prog} {name}: no help text"
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                assert set(helps) == set(action.choices) and all(h and h.strip() for h in helps.values()), helps
    assert {"circuitfade demo", "circuitfade local-series", "circuitfade analyze", "circuitfade screen"} <= seen


def test_screen_takes_the_checkpoint_flags_analyze_takes():
    import argparse

    from circuitfade.commands.analyze import build_parser as analyze_parser
    from circuitfade.commands.screen import build_parser as screen_parser

    def finding(ap):
        groups = [g for g in ap._action_groups if g.title and g.title.startswith("finding the checkpoints")]
        assert len(groups) == 1, [g.title for g in ap._action_groups]
        return {(a.option_strings[0], a.type, a.metavar) for a in groups[0]._group_actions}

    a, s = finding(analyze_parser()), finding(screen_parser())
    assert a == s and {o for o, _, _ in a} >= {"--pattern", "--steps", "--step-pattern", "--config", "--key"}
    ns = screen_parser().parse_args(["x", "--steps", "0,4", "--step-pattern", r"ckpt_(\d+)", "--key", "ema"])
    assert isinstance(ns, argparse.Namespace) and ns.steps == [0, 4] and ns.key == "ema"


def test_screen_uses_the_checkpoint_flags(tiny_run, tmp_path, capsys):
    out = tmp_path / "s" / "screen.html"
    assert main(["screen", str(tiny_run), "--steps", "0,4", "--n", "4", "--quiet", "--out", str(out)]) == 0
    integrity = (out.parent / "integrity.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in integrity[1:]] == ["0", "4"]  # step 2 left out, as asked


def _no_step_folder(folder: Path) -> Path:
    """Two state-dict files whose names state no step, with their config."""
    from circuitfade.compat import make_config, plain_model

    cfg = make_config(dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=32, attn_only=True,
                           act_fn=None, seed=0))
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(json.loads(json.dumps(cfg.to_dict(), default=str))))
    for name in ("first.pt", "second.pt"):
        torch.save(plain_model(cfg).state_dict(), folder / name)
    return folder


@pytest.mark.parametrize("command", ["analyze", "screen"])
def test_errors_name_flags_not_python_arguments(tmp_path, capsys, command):
    folder = _no_step_folder(tmp_path / "sd")
    assert main([command, str(folder), "--out", str(tmp_path / "o" / "r.html"), "--quiet"]) == 2
    err = one_line_error(capsys, "first.pt", "--steps S,S,...", "--step-pattern '", "--pattern '",
                         f"(see circuitfade {command} --help)")
    assert "steps=" not in err and "step_pattern=" not in err and "pattern=" not in err


@pytest.mark.parametrize("argv, flag, python", [
    (["screen", "RUN", "--n", "-1"], "--n must be", "n (number"),
    (["analyze", "RUN", "--n", "1"], "--n: expected at least 2", "n: expected"),
    (["analyze", "RUN", "--every", "0"], "--every: expected", "every: expected"),
    (["train", "--steps", "0"], "--steps must be", "TrainConfig.steps"),
    (["train", "--seed", "-1"], "--seed must be", "seed must"),
])
def test_library_messages_are_in_the_commands_flags(tiny_run, tmp_path, capsys, argv, flag, python):
    argv = [str(tiny_run) if a == "RUN" else a for a in argv] + ["--out", str(tmp_path / "o" / "x.html"), "--quiet"]
    assert main(argv) == 2
    err = one_line_error(capsys, flag, "--help")
    assert python not in err.replace(flag, "")


def test_flag_translation_rules():
    from circuitfade.commands.boundary import in_flags

    flags = {"steps": ("--steps", "S,S,..."), "step_pattern": ("--step-pattern", "REGEX"), "n": ("--n", None),
             "force": ("--force", None), "config": ("--config", "JSON"), "seq_len": ("--seq-len", "L")}
    assert in_flags("pass steps=[...] or step_pattern=r'(\\d+)'", flags) == "pass --steps S,S,... or --step-pattern '(\\d+)'"
    assert in_flags("x.html exists; pass --force (force=True) to replace it", flags) == \
        "x.html exists; pass --force to replace it"
    assert in_flags("seq_len must be an int >= 2, got 1", flags) == "--seq-len must be an int >= 2, got 1"
    assert in_flags("TrainConfig.steps must be a positive integer", flags) == "--steps must be a positive integer"
    assert in_flags("folder: pass config= (a config)", flags) == "folder: pass --config (a config)"
    # words that are not arguments, and names in the middle of a sentence, stay as they are
    assert in_flags("epoch=3-step=300.ckpt has 4 steps: n ok", flags) == "epoch=3-step=300.ckpt has 4 steps: n ok"
    assert in_flags("lr=0.1 is not a flag", flags) == "lr=0.1 is not a flag"


def test_a_long_error_is_one_bounded_line_pointing_at_help(tmp_path, capsys):
    from circuitfade.commands.boundary import MAX_ERROR_CHARS

    assert main(["train", "--path", "bogus", "--out", str(tmp_path / "r")]) == 2
    err = one_line_error(capsys, "invalid gate path 'bogus'", "fade600->0", "in all", "(see circuitfade train --help)")
    assert len(err) <= MAX_ERROR_CHARS + len("circuitfade train: error: ") + len(" (see circuitfade train --help)")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv", [["screen"], ["screen", "x", "--bogus"], ["analyze", "x", "--steps", "0,x"],
                                  ["demo", "--seed", "x"], []])
def test_usage_errors_are_one_line_with_a_help_pointer(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = one_line_error(capsys, "error:", "--help)")
    assert "usage:" not in err


@pytest.mark.parametrize("command", ["analyze", "screen"])
def test_a_failed_command_leaves_no_output_folder(tmp_path, capsys, command):
    out = tmp_path / "new" / "deeper" / "report.html"
    assert main([command, str(tmp_path / "nowhere"), "--out", str(out), "--quiet"]) == 2
    one_line_error(capsys, "nowhere")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main([command, str(tmp_path / "nowhere"), "--out", str(kept / "report.html"), "--quiet"]) == 2
    assert kept.is_dir()  # a folder that was there before stays


def test_removing_new_folders_keeps_folders_with_files(tmp_path):
    from circuitfade.commands.boundary import removing_new_folders

    with pytest.raises(RuntimeError):
        with removing_new_folders(tmp_path / "a" / "b", tmp_path / "c"):
            (tmp_path / "a" / "b").mkdir(parents=True)
            (tmp_path / "c").mkdir()
            (tmp_path / "c" / "partial.csv").write_text("x")
            raise RuntimeError("failed")
    assert not (tmp_path / "a").exists() and (tmp_path / "c" / "partial.csv").is_file()
    with removing_new_folders(tmp_path / "d"):  # success: nothing removed
        (tmp_path / "d").mkdir()
    assert (tmp_path / "d").is_dir()


def test_screen_checks_its_arguments_before_any_progress_bar(tiny_run, tmp_path, capfd):
    for bad in (["--n", "-1"], ["--seq-len", "0"], ["--bos", "-2"]):
        assert main(["screen", str(tiny_run), "--out", str(tmp_path / "s" / "screen.html"), *bad]) == 2
        err = capfd.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "\r" not in err and "%|" not in err, err
        assert bad[0] in err
    assert not (tmp_path / "s").exists()


def test_bounded_summarises_lists_of_choices():
    from circuitfade.commands.boundary import bounded

    assert bounded("short; fine") == "short; fine"
    names = ", ".join(f"path{i}" for i in range(12))
    forms = "; ".join(f"form{i}{{x}}" for i in range(17))
    message = f"invalid 'x'; named: {names}; accepted forms: f; {forms}; see the docs"
    assert bounded(message, limit=200) == ("invalid 'x'; named: path0, path1, path2, path3, ... (12 in all); "
                                           "accepted forms: f; form0{x}; form1{x}; form2{x}; form3{x}; ... (13 more); "
                                           "see the docs")
    text = bounded(message, limit=120)  # still too long: trailing clauses go
    assert len(text) <= 120 and text.endswith("form2{x}; ...") and "(12 in all)" in text
    long = bounded("word " * 500, limit=50)
    assert len(long) <= 50 and long.endswith("...")
