"""What several studies share beyond the library: the command-line entry point, and a study's
output folder written as one unit.

:func:`study_main` runs every ``python -m studies.<name>`` command. The folder a command writes
(its ``--out``, e.g. ``results/<name>/``) holds one run's files, never a mix of two:

* before the study writes anything, a snapshot of the folder as it is (the previous complete
  results, or none) is put beside it, in ``.<name>.study/previous`` (files copied;
  ``.safetensors`` files, which the library only ever replaces whole, hard-linked);
* a run that ends well removes the snapshot: the folder is the new complete set;
* a run that fails or is interrupted after writing something puts the folder back as it was
  (the snapshot, or no folder) and keeps what the run wrote in ``.<name>.study/interrupted``;
  the message says so. The same command run again resumes from those files (its sub-folders,
  e.g. finished training runs, are carried over; its top-level result files are written again),
  so it needs ``--force`` only where the first run did;
* a run killed outright (no chance to clean up) is put back by the next study command on that
  folder, before it reads anything (``.<name>.study/run.json`` records the run in progress);
* a run that wrote nothing (a bad argument, an output that needs ``--force``) leaves the folder
  exactly as it found it, and no folder where there was none.

The output folder is the ``out`` attribute of the study's parsed arguments (every study has
``--out``), read when the study parses its command line, so the studies need no code for it.
One study command writes a given folder at a time (a lock on ``.<name>.study``); a folder that
holds the current directory is written in place, as before.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from circuitfade.commands.boundary import RESUME_HINT, guarded
from circuitfade.io import write_json
from circuitfade.train.lock import RunLocked, run_lock

__all__ = ["study_main", "StudyOutputs", "study_folder"]

RECORD = "run.json"
"""The record of a run in progress, in the study folder (the command and whether OUT existed)."""


def study_folder(out: str | os.PathLike) -> Path:
    """Where :func:`study_main` keeps ``out``'s snapshot and an interrupted run's files:
    ``.<name>.study`` beside ``out``."""
    out = Path(os.path.abspath(out))
    return out.parent / f".{out.name}.study"


def _files(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (relative path -> what identifies its content on disk)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            found[str(p.relative_to(root))] = ("dir",) if name in dirnames and not p.is_symlink() else \
                (st.st_ino, st.st_size, st.st_mtime_ns)
    return found


def _copy(src: str, dst: str) -> None:
    """A snapshot's copy of one file: a hard link for ``.safetensors`` (always replaced whole,
    never rewritten in place), a copy otherwise."""
    if src.endswith(".safetensors"):
        with contextlib.suppress(OSError):
            os.link(src, dst)
            return
    shutil.copy2(src, dst)


def _move_into(src: Path, dst: Path) -> None:
    """Move every file under ``src`` to the same place under ``dst`` (replacing), then remove ``src``."""
    for dirpath, _, filenames in os.walk(src):
        for name in filenames:
            f = Path(dirpath) / name
            target = dst / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, target)
    shutil.rmtree(src)


class StudyOutputs:
    """One study command's output folder ``out`` as a unit (see the module's docstring):
    :meth:`begin` before the study writes, :meth:`end` after it ends; ``note`` is then the line
    that says where the files are and what to run next (``None`` when there is nothing to say)."""

    def __init__(self, out: str | os.PathLike, command: str):
        self.out = Path(out)
        self.command = command
        self.home = study_folder(out)
        self.previous, self.interrupted = self.home / "previous", self.home / "interrupted"
        self.note: str | None = None
        self._locks = contextlib.ExitStack()
        self._begun = False
        self._existed = False
        self._before: dict[str, tuple] = {}

    # ---------------------------------------------------------------------------------- begin
    def begin(self) -> None:
        """Lock the folder, put back what a killed run left, snapshot the folder, record the run,
        and carry over the sub-folders of an interrupted run of the same command."""
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out}: exists and is not a folder")
        self.home.mkdir(parents=True, exist_ok=True)
        try:
            self._locks.enter_context(run_lock(self.home))
        except RunLocked as e:  # (the holder keeps its folder)
            raise RunLocked(f"{self.out} is being written by another study command ({e})") from None
        try:
            self.recover()
            self._existed = self.out.is_dir()
            staging = self.home / "previous.tmp"
            shutil.rmtree(staging, ignore_errors=True)
            if self._existed:
                shutil.copytree(self.out, staging, symlinks=True, copy_function=_copy)
                os.replace(staging, self.previous)
            write_json(self.home / RECORD, {"command": self.command, "existed": self._existed,
                                            "started": time.strftime("%Y-%m-%d %H:%M:%S")})
            self._begun = True
            self._before = _files(self.out) if self.out.is_dir() else {}
            self._resume()  # what it carries over counts as written by this run
        except BaseException:
            if not self._begun:
                self._locks.close()
                with contextlib.suppress(OSError):
                    self.home.rmdir()  # only when nothing is kept there
            raise

    def recover(self) -> str | None:
        """Put ``out`` back as it was before a run that was killed mid-way (its files go to
        ``interrupted``); returns the line saying so, or ``None`` when no run was cut short."""
        record = self.home / RECORD
        if not record.is_file():  # no run in progress: a snapshot left here is stale
            shutil.rmtree(self.previous, ignore_errors=True)
            shutil.rmtree(self.home / "previous.tmp", ignore_errors=True)
            return None
        try:
            rec = json.loads(record.read_text())
        except ValueError:
            rec = {}
        existed = bool(rec.get("existed", self.previous.is_dir()))
        moved = self._set_aside(existed, rec.get("command", "?"))
        record.unlink()
        line = (f"a run of `{rec.get('command', '?')}` was cut short; {self._where(existed, moved)}")
        print(f"note: {line}", file=sys.stderr)
        return line

    def _set_aside(self, existed: bool, command: str) -> bool:
        """``out`` -> ``interrupted`` (when it holds anything), snapshot -> ``out``; whether files were kept."""
        moved = False
        if self.out.is_dir() and (not existed or self.previous.is_dir()):
            shutil.rmtree(self.interrupted, ignore_errors=True)
            os.replace(self.out, self.interrupted)
            write_json(self.interrupted / ".command.json", {"command": command})
            moved = True
        if existed and self.previous.is_dir():
            os.replace(self.previous, self.out)
        return moved

    def _where(self, existed: bool, moved: bool) -> str:
        back = f"{self.out} holds its previous complete results again" if existed else f"{self.out} was not created"
        if not moved:
            return back
        return (f"{back}; this run's files are kept in {self.interrupted}: run the same command again to "
                "resume from them")

    def _resume(self) -> None:
        """The sub-folders of an interrupted run of this same command, moved into ``out``."""
        try:
            rec = json.loads((self.interrupted / ".command.json").read_text())
        except (OSError, ValueError):
            return
        if rec.get("command") != self.command:
            print(f"note: {self.interrupted} holds an interrupted run of `{rec.get('command')}`; it is kept "
                  "(run that command to resume it, or delete the folder)", file=sys.stderr)
            return
        for sub in sorted(p for p in self.interrupted.iterdir() if p.is_dir()):
            _move_into(sub, self.out / sub.name)
        shutil.rmtree(self.interrupted)

    # ---------------------------------------------------------------------------------- end
    def end(self, ok: bool) -> None:
        """After the study: keep the new complete set (``ok``), or put the folder back as it was."""
        if not self._begun:
            return
        try:
            if ok:
                (self.home / RECORD).unlink()
            elif self._wrote_nothing():
                self._undo_empty_folders()
                (self.home / RECORD).unlink()
            else:
                moved = self._set_aside(self._existed, self.command)
                (self.home / RECORD).unlink()
                self.note = self._where(self._existed, moved)
            shutil.rmtree(self.previous, ignore_errors=True)
        finally:
            self._locks.close()
            with contextlib.suppress(OSError):
                self.home.rmdir()  # only when nothing is kept there

    def _wrote_nothing(self) -> bool:
        now = _files(self.out) if self.out.is_dir() else {}
        return all(v == ("dir",) for k, v in now.items() if k not in self._before) and \
            all(now.get(k) == v for k, v in self._before.items())

    def _undo_empty_folders(self) -> None:
        """Remove the folders the run created (empty, since it wrote nothing), ``out`` included
        when it did not exist before."""
        if not self.out.is_dir():
            return
        if not self._existed:
            shutil.rmtree(self.out)
            return
        for rel in sorted((k for k in _files(self.out) if k not in self._before), key=len, reverse=True):
            with contextlib.suppress(OSError):
                (self.out / rel).rmdir()


@contextlib.contextmanager
def _on_parsed(callback: Callable[[argparse.Namespace], None]):
    """Call ``callback(namespace)`` each time a command line has been parsed and handed back to the
    caller (``parse_args``, ``parse_known_args``; not for the calls argparse makes within), while
    the block runs."""
    depth = 0

    def hooked(real):
        def parse(self, args=None, namespace=None):
            nonlocal depth
            depth += 1
            try:
                result = real(self, args, namespace)
            finally:
                depth -= 1
            if depth == 0:
                callback(result[0] if isinstance(result, tuple) else result)
            return result
        return parse

    saved = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    for name, real in saved.items():
        setattr(argparse.ArgumentParser, name, hooked(real))
    try:
        yield
    finally:
        for name, real in saved.items():
            setattr(argparse.ArgumentParser, name, real)


def _holds_cwd(out: Path) -> bool:
    here, out = Path.cwd().resolve(), out.resolve()
    return here == out or out in here.parents


class _Hint:
    """The text after "interrupted": where the files are (once the folder is put back), else the usual one."""

    def __init__(self, unit: list[StudyOutputs]):
        self.unit = unit

    def __bool__(self) -> bool:
        return True

    def __format__(self, spec: str) -> str:
        return (self.unit[0].note if self.unit and self.unit[0].note else None) or RESUME_HINT


def study_main(prog: str, main: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run a study's ``main(argv)`` as a command: a user error (bad input, a full disk, a diverged
    run) ends as one line on stderr and exit code 2, Ctrl-C as one line and exit code 130.

    The folder the study writes (its parsed ``out``) is one unit (:class:`StudyOutputs`): after
    a failure or Ctrl-C it holds the previous complete results (or does not exist), the run's
    files are kept aside, and the message says where and what to run next."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = " ".join([prog, *map(shlex.quote, args)])
    unit: list[StudyOutputs] = []

    def parsed(ns: argparse.Namespace) -> None:
        out = getattr(ns, "out", None)
        if unit or not isinstance(out, (str, os.PathLike)) or not str(out) or _holds_cwd(Path(out)):
            return
        unit.append(StudyOutputs(out, command))
        unit[0].begin()

    def run() -> int:
        try:
            with _on_parsed(parsed):
                code = int(main(args) or 0)
        except BaseException:
            if unit:
                unit[0].end(ok=False)
            raise
        if unit:
            unit[0].end(ok=code == 0)
        return code

    code = guarded(prog, run, resume=_Hint(unit))
    if code == 2 and unit and unit[0].note:
        print(f"{prog}: {unit[0].note}", file=sys.stderr)
    return code
