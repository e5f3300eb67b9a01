"""The command-line boundary every ``circuitfade`` subcommand and every study's command shares.

* :class:`Parser`: an ``argparse`` parser whose usage errors are one line with a pointer
  to ``--help`` (exit code 2);
* :func:`guarded`: runs a command; a user error (bad input, a held lock, a full disk) ends as
  one line on stderr, in the command's own syntax, and exit code 2; Ctrl-C as one line and
  exit code 130;
* :func:`in_flags`: the library's messages name Python arguments (``steps=[...]``,
  ``n (number of sequences) must be ...``); this rewrites them with the command's flags
  (``--steps S,S,...``, ``--n ...``). :func:`error_line` adds the bound on length (long
  lists of choices summarised) and the ``--help`` pointer; every error passes through it;
* :func:`add_source_arguments` / :func:`source_from_args`: the one argument group for
  finding checkpoints (``--config --pattern --steps --step-pattern --steps-per-epoch
  --key``), shared by ``analyze`` and ``screen``;
* :func:`removing_new_folders`: a command that fails leaves no folder it created behind;
* :func:`check_count`: a positive-integer flag, checked before any work.

Nothing here imports torch, pandas or TransformerLens at import time (``circuitfade --help``
stays quick).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

MAX_ERROR_CHARS = 400
"""The longest error message :func:`error_line` prints (before the ``--help`` pointer)."""

RESUME_HINT = "finished checkpoints are kept: run the same command again to resume"
"""What :func:`guarded` adds after "interrupted" for commands that resume (the default)."""


class UsageError(ValueError):
    """A bad command-line value (reported as one line, exit code 2)."""


# --------------------------------------------------------------------------------------
# messages in the command's own syntax, one bounded line
# --------------------------------------------------------------------------------------
def flag_names(parser: argparse.ArgumentParser) -> dict[str, tuple[str, str | None]]:
    """``{dest: (flag, metavar)}`` for every option of ``parser`` (``"step_pattern"`` ->
    ``("--step-pattern", "REGEX")``): the names :func:`in_flags` rewrites."""
    out = {}
    for a in parser._actions:  # argparse keeps its actions here; there is no public accessor
        longs = [s for s in a.option_strings if s.startswith("--")]
        if longs and a.dest not in ("help", argparse.SUPPRESS):
            mv = a.metavar if isinstance(a.metavar, str) else None
            out[a.dest] = (longs[0], mv if a.nargs != 0 else None)
    return out


_VALUE = r"(\[\.\.\.\]|r?'[^']*'|r?\"[^\"]*\"|True\b|False\b|None\b|[^\s,;)]*)"


def in_flags(message: str, flags: Mapping[str, tuple[str, str | None]]) -> str:
    """``message`` with the library's argument names replaced by the command's flags.

    Rewritten: keyword arguments anywhere (``steps=[...]`` -> ``--steps S,S,...``,
    ``step_pattern=r'(\\d+)'`` -> ``--step-pattern '(\\d+)'``, ``force=True`` -> ``--force``),
    and the argument a message starts with (``n: ...``, ``n (number of sequences) must``,
    ``TrainConfig.steps must`` -> ``--n: ...``, ``--n (number ...`` and ``--steps must``).
    Names that are not options of the command are left as they are.
    """
    if not flags:
        return message

    def keyword(m: re.Match) -> str:
        name, value = m.group(1), m.group(2)
        if name not in flags:
            return m.group(0)
        flag, metavar = flags[name]
        if metavar is None or value in ("", "True", "False", "None"):
            return flag
        if value == "[...]":
            return f"{flag} {metavar}"
        return f"{flag} {value.lstrip('r')}"

    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    out = re.sub(rf"(?<![\w.\-/])({names})={_VALUE}", keyword, message)
    out = re.sub(rf"^(?:[A-Z]\w*Config\.)?({names})(?=:| must\b| \(| is\b| expects?\b)",
                 lambda m: flags[m.group(1)][0], out)
    return re.sub(r"(--[\w-]+) \(\1\)", r"\1", out)  # "pass --force (force=True)" said the flag twice


def _shorten_list(clause: str, keep: int = 4) -> str:
    """``"a: x1, x2, ..., x12"`` as ``"a: x1, x2, x3, x4, ... (12 in all)"``."""
    items = clause.split(", ")
    if len(items) <= keep + 1:
        return clause
    return ", ".join(items[:keep]) + f", ... ({len(items)} in all)"


def _shorten_runs(clauses: list[str], keep: int = 4) -> list[str]:
    """Runs of more than ``keep + 1`` one-word clauses (``"a; b; c; ..."``, a list of choices
    written with ``;``) as their first ``keep`` and ``"... (N more)"``."""
    out: list[str] = []
    run: list[str] = []
    for c in [*clauses, None]:
        if c is not None and " " not in c:
            run.append(c)
            continue
        out += run if len(run) <= keep + 1 else [*run[:keep], f"... ({len(run) - keep} more)"]
        run = []
        if c is not None:
            out.append(c)
    return out


def bounded(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` on one line of at most ``limit`` characters: whitespace runs become one
    space; if still too long, lists of choices are summarised (a comma-separated list of more
    than five items keeps its first four, ``... (N in all)``; a run of more than five one-word
    ``;``-separated choices keeps its first four, ``... (N more)``), then trailing
    ``;``-separated clauses are dropped (``; ...``), then the text is cut at a word (``...``)."""
    text = " ".join(message.split())
    if len(text) <= limit:
        return text
    clauses = _shorten_runs([_shorten_list(c) for c in text.split("; ")])
    text = "; ".join(clauses)
    while len(text) > limit and len(clauses) > 1:
        clauses.pop()
        text = "; ".join(clauses) + "; ..."
    if len(text) > limit:
        text = text[: limit - 4].rsplit(" ", 1)[0] + " ..."
    return text


def error_line(prog: str, message: str, *, flags: Mapping | None = None, usage: bool = True) -> str:
    """The one line a failed command prints: ``"{prog}: error: {message}"`` with ``message`` in
    the command's flags (:func:`in_flags`), bounded (:func:`bounded`) and, for errors in the
    input (``usage``), followed by a pointer to ``{prog} --help``."""
    text = bounded(in_flags(" ".join(str(message).split()), flags or {}))
    return f"{prog}: error: {text}" + (f" (see {prog} --help)" if usage else "")


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors are one line (:func:`error_line`) and exit 2."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        print(error_line(self.prog, message), file=sys.stderr)
        raise SystemExit(2)


# --------------------------------------------------------------------------------------
# running a command
# --------------------------------------------------------------------------------------
def _user_errors() -> tuple[type[BaseException], ...]:
    from concurrent.futures import BrokenExecutor  # a worker process died (killed, out of memory)

    from circuitfade.compat import TLLineError  # backend='hooked' under TransformerLens 4
    from circuitfade.train import RunLocked, TrainingDiverged

    return (ValueError, OSError, RunLocked, TrainingDiverged, BrokenExecutor, TLLineError)


def _message(e: BaseException) -> tuple[str, bool]:
    """(the error's text, whether it is about the input: ``--help`` can help)."""
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename else ""
        hint = " (disk full)" if e.errno == errno.ENOSPC else ""
        return f"{where}{e.strerror}{hint}", False
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0]), True
    text = " ".join(str(e).split()) or type(e).__name__
    return text, isinstance(e, ValueError) and not isinstance(e, OSError)


def _exit_at_once(signum, frame) -> None:  # pragma: no cover - runs in a process that is ending
    """A second Ctrl-C while the process winds down (atexit handlers, pool shutdown): exit
    now, with no traceback (files are written atomically, so nothing is left half-written)."""
    os._exit(130)


def guarded(prog: str, fn, *args, resume: str | None = RESUME_HINT, flags: Mapping | None = None,
            also: tuple[type[BaseException], ...] = ()) -> int:
    """Run ``fn(*args)``; user errors (and the exception types in ``also``) -> one line
    (:func:`error_line`, with ``flags``) + exit 2, Ctrl-C -> one line + exit 130.

    The Ctrl-C line is ``"{prog}: interrupted"`` plus ``"; {resume}"`` when ``resume`` is
    given (commands that do not resume pass ``resume=None``). After a Ctrl-C, a further
    one ends the process at once (exit 130) instead of raising inside the interpreter's
    exit handlers.
    """
    try:
        return int(fn(*args) or 0)
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _exit_at_once)
        print(f"{prog}: interrupted" + (f"; {resume}" if resume else ""), file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - filtered just below; anything else is a bug: traceback
        if not isinstance(e, _user_errors() + tuple(also)):
            raise
        text, usage = _message(e)
        print(error_line(prog, text, flags=flags, usage=usage), file=sys.stderr)
        return 2


def check_count(flag: str, v, minimum: int = 1):
    """``v`` if it is an integer ``>= minimum`` (``None`` passes: the flag was not given), else a
    :class:`UsageError` naming ``flag`` (so ``--workers 0`` starts no work)."""
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise UsageError(f"{flag} must be {what}, got {v!r}")
    return v


@contextlib.contextmanager
def removing_new_folders(*folders: str | os.PathLike) -> Iterator[None]:
    """Run the body; if it raises (or is interrupted), remove the folders among ``folders`` and
    their parents that did not exist before and are still empty (deepest first), so a failed
    command leaves no empty output folder behind. Folders holding anything are kept."""
    new: list[Path] = []
    for f in folders:
        p = Path(f).absolute()
        while not p.exists() and p != p.parent:
            new.append(p)
            p = p.parent
    try:
        yield
    except BaseException:
        for p in sorted(set(new), key=lambda q: len(q.parts), reverse=True):
            with contextlib.suppress(OSError):
                p.rmdir()  # only an empty folder goes
        raise


# --------------------------------------------------------------------------------------
# finding checkpoints: one argument group for analyze and screen
# --------------------------------------------------------------------------------------
SOURCE_OPTIONS = ("config", "pattern", "steps", "step_pattern", "steps_per_epoch", "key")
"""The :func:`circuitfade.store.attach` arguments :func:`add_source_arguments` gives flags."""


def step_list(text: str) -> list[int]:
    """``"0,100,400"`` as ``[0, 100, 400]`` (argparse type of ``--steps``)."""
    try:
        steps = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integer steps such as 0,100,400, got {text!r}")
    if not steps:
        raise argparse.ArgumentTypeError("expected at least one step")
    return steps


def add_source_arguments(ap: argparse.ArgumentParser, source: str) -> argparse._ArgumentGroup:
    """Add the checkpoint-finding flags (:data:`SOURCE_OPTIONS`) to ``ap`` as one group;
    ``source`` is the positional's metavar (``RUN_DIR``, ``SERIES``)."""
    g = ap.add_argument_group("finding the checkpoints in " + source + " (the arguments of circuitfade.store.attach)")
    g.add_argument("--config", metavar="JSON",
                   help="model config (a JSON file) for a folder of state-dict files (default: config.json "
                        "beside them)")
    g.add_argument("--pattern", metavar="GLOB",
                   help=f"only the files / revision folders of {source} matching GLOB (e.g. 'step*.pt')")
    g.add_argument("--steps", metavar="S,S,...", type=step_list,
                   help="step labels of the files in name order (state-dict files, Hugging Face folders), or the "
                        "steps to use (run directories); comma-separated")
    g.add_argument("--step-pattern", metavar="REGEX",
                   help="regex whose group is the step in each file / folder name, e.g. 'ckpt_(\\d+)'")
    g.add_argument("--steps-per-epoch", type=int, metavar="N",
                   help="steps per epoch, for files whose names state only an epoch")
    g.add_argument("--key", metavar="KEY",
                   help="entry of full .pt checkpoints holding the model's state dict (default: model, state_dict "
                        "or model_state_dict)")
    return g


def source_from_args(ns: argparse.Namespace, source: str):
    """``source`` attached with the checkpoint-finding flags given on the command line
    (:func:`circuitfade.store.attach`), or ``source`` as it is when none was given."""
    options = {k: getattr(ns, k, None) for k in SOURCE_OPTIONS}
    if all(v is None for v in options.values()):
        return source
    from circuitfade.store import attach

    return attach(source, **{k: v for k, v in options.items() if v is not None})
