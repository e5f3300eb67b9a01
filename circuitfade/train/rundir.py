"""The run directory: :class:`RunDir` owns a run folder's file names, the one checkpoint-name
pattern, and reading and writing every file in it.

::

    RUN/
      config.json                        everything needed to rebuild the run (RunDir.write_config)
      metrics.csv                        step, gates, train loss, eval under each gate condition
      checkpoints/step_000300.safetensors            model weights
      checkpoints/step_000300.state.safetensors      optimizer + RNG state (to resume)
      done.json                          written last, when the run has finished (RunDir.finish)
      failed.json                        instead of done.json, when the run diverged (RunDir.record_failure)
      .lock                              held while a trainer writes the folder (circuitfade.train.lock)

Every file is written atomically (:mod:`circuitfade.io`) and every checkpoint file records
its step and a checksum. A checkpoint is resumed only when it is verifiably the trainer's
for this run at that step (:meth:`RunDir.load_checkpoint`); a folder holding a second file for a
step, or a step file under another name, is refused (:meth:`RunDir.complete_checkpoints`).
The optimizer's state is saved as flat tensors (``optim.<index>.<key>``, no pickle):
:func:`optimizer_to_tensors`, :func:`check_optimizer_tensors`, :func:`optimizer_from_tensors`.
No other module spells these names (``tests/library/structure/test_structure.py`` checks it).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load as load_safetensors_bytes

from circuitfade.io import (
    CHECKSUM_KEY,
    MAX_STEP,
    CheckpointError,
    atomic_write,
    check_file,
    check_state_dict,
    checksum_of,
    is_temp_file,
    read_json,
    save_tensors,
    verify_checksum,
    write_json,
)
from circuitfade.train.config import RunConfig, TrainingDiverged
from circuitfade.train.state import Run, apply_hparams

__all__ = ["RunDir", "CONFIG_FILE", "METRICS_FILE", "DONE_FILE", "FAILED_FILE", "CKPT_DIR", "LOCK_FILE",
           "STATE_FORMAT", "checkpoint_name", "parse_checkpoint_name", "optimizer_to_tensors",
           "optimizer_from_tensors", "check_optimizer_tensors", "ADAMW_STATE", "ADAMW_FIXED"]

CONFIG_FILE = "config.json"
"""The run's :class:`~circuitfade.train.config.RunConfig` (JSON)."""
METRICS_FILE = "metrics.csv"
"""One row per evaluation."""
DONE_FILE = "done.json"
"""``{"step", "final"}``, written last when the run has finished."""
FAILED_FILE = "failed.json"
"""``{"step", "error"}``, written instead of :data:`DONE_FILE` when the run diverged."""
CKPT_DIR = "checkpoints"
"""The folder of checkpoint files."""
LOCK_FILE = ".lock"
"""The file a trainer holds an OS lock on (:func:`circuitfade.train.lock.run_lock`)."""
STATE_FORMAT = "circuitfade-state"
"""The ``format`` metadata of a state file (optimizer + generators + metrics)."""

_CHECKPOINT_NAME = re.compile(r"step_(\d+)(\.state)?\.safetensors")


def parse_checkpoint_name(name: str) -> tuple[int, bool] | None:
    """``(step, is_state)`` for a name of the trainer's form (``step_<digits>.safetensors`` or
    ``step_<digits>.state.safetensors``), else ``None``: the one checkpoint-name pattern, used by the
    trainer and by :mod:`circuitfade.store` (:func:`checkpoint_name` writes the canonical spelling)."""
    m = _CHECKPOINT_NAME.fullmatch(name)
    return None if m is None else (int(m.group(1)), m.group(2) is not None)


def checkpoint_name(step: int, state: bool = False) -> str:
    """The file name the trainer gives step ``step``'s weights (``state=False``) or state file:
    ``step_000300.safetensors`` / ``step_000300.state.safetensors`` (at least six digits)."""
    return f"step_{step:06d}{'.state' if state else ''}.safetensors"


# --------------------------------------------------------------------------------------
# the optimizer's state as flat tensors
# --------------------------------------------------------------------------------------

ADAMW_STATE = ("exp_avg", "exp_avg_sq", "step")
"""The optimizer state kept per parameter (AdamW without amsgrad), saved as ``optim.<index>.<key>``."""


def optimizer_to_tensors(opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """``(tensors, metadata)``: ``opt``'s state as ``optim.<index>.<key>`` tensors and its
    ``param_groups`` as JSON metadata (what a state file holds; no pickle)."""
    sd = opt.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, val in state.items():
            tensors[f"optim.{idx}.{key}"] = torch.as_tensor(val)
    groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": json.dumps(groups)}


def check_optimizer_tensors(opt: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str],
                            source: str, step: int, required: tuple[int, ...] = ()) -> None:
    """Raise :class:`~circuitfade.io.CheckpointError` naming ``source`` unless the ``optim.*``
    tensors and ``param_groups`` metadata are a state :func:`optimizer_from_tensors` can load
    into ``opt`` for global step ``step``.

    Checked: every ``optim.<i>.<key>`` names a parameter index ``i`` of ``opt`` and a key of
    :data:`ADAMW_STATE`; each index present has all three keys; ``exp_avg`` and
    ``exp_avg_sq`` have the parameter's shape and dtype and finite values, ``exp_avg_sq`` none
    below 0; ``step`` is a
    scalar whole number in ``[1, step]`` (a parameter is stepped at most once per global
    step); every index in ``required`` is present; ``param_groups`` is JSON naming each
    parameter index exactly once, and each group holds the settings of ``opt``'s (betas, eps,
    amsgrad, maximize...: :data:`ADAMW_FIXED`) and a finite lr and weight decay >= 0.
    """
    params = [p for g in opt.param_groups for p in g["params"]]
    seen: dict[int, set[str]] = {}
    for name, t in tensors.items():
        if not name.startswith("optim."):
            continue
        parts = name.split(".", 2)
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(params) or parts[2] not in ADAMW_STATE:
            raise CheckpointError(f"{source}: unexpected optimizer tensor {name!r} (expected optim.<index>."
                                  f"{{{'|'.join(ADAMW_STATE)}}} with index < {len(params)}, the model's parameters)")
        i, key = int(parts[1]), parts[2]
        p = params[i]
        if key == "step":
            v = float(t) if t.dim() == 0 and t.is_floating_point() else math.nan
            if not (math.isfinite(v) and v == int(v) and 1 <= v <= step):
                raise CheckpointError(f"{source}: {name} should be a scalar step count in [1, {step}], got "
                                      f"{tuple(t.shape)} {t.dtype} {t.flatten()[:1].tolist()}")
        else:
            if tuple(t.shape) != tuple(p.shape) or t.dtype != p.dtype:
                raise CheckpointError(f"{source}: {name} has shape {tuple(t.shape)} {t.dtype}; the parameter it "
                                      f"belongs to has {tuple(p.shape)} {p.dtype}")
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{source}: {name} holds non-finite values (a corrupt file: the trainer "
                                      "never writes them)")
            if key == "exp_avg_sq" and not bool((t >= 0).all()):
                raise CheckpointError(f"{source}: {name} holds negative values (a corrupt file: AdamW's second "
                                      "moment is a running mean of squares, never below 0)")
        seen.setdefault(i, set()).add(key)
    partial = sorted(i for i, keys in seen.items() if keys != set(ADAMW_STATE))
    if partial:
        i = partial[0]
        raise CheckpointError(f"{source}: optimizer state of parameter {i} is incomplete: has "
                              f"{sorted(seen[i])}, expected {list(ADAMW_STATE)}")
    missing = [i for i in required if i not in seen]
    if missing:
        raise CheckpointError(f"{source}: no optimizer state for {len(missing)} parameters (indices "
                              f"{missing[:6]}) at step {step}; every parameter but the gate logits has it "
                              "after the first step")
    if "param_groups" not in meta:
        raise CheckpointError(f"{source}: no 'param_groups' metadata (the optimizer's settings)")
    try:
        groups = json.loads(meta["param_groups"])
        ids = sorted(i for g in groups for i in g["params"])
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{source}: 'param_groups' metadata is not the optimizer's settings ({e})") from None
    if ids != list(range(len(params))) or len(groups) != len(opt.param_groups):
        raise CheckpointError(f"{source}: 'param_groups' metadata names parameters {ids[:6]}...; the model has "
                              f"{len(params)} in {len(opt.param_groups)} group(s)")
    for k, (g, mine) in enumerate(zip(groups, opt.param_groups)):
        _check_group(g, mine, f"{source}: 'param_groups' metadata, group {k}")


ADAMW_FIXED = ("betas", "eps", "amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")
"""AdamW settings a state file must share with the optimizer the config makes (lr and weight decay
may differ: the config's win on resume, see :func:`apply_hparams`; fused/foreach are the kernel)."""


def _check_group(saved, mine: Mapping, where: str) -> None:
    """Raise :class:`CheckpointError` unless the saved param group ``saved`` holds the settings of the
    fresh optimizer's group ``mine`` (:data:`ADAMW_FIXED`, those recorded) and a usable lr and weight decay."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{where} is not a settings object")
    for key in ADAMW_FIXED:
        if key not in saved or key not in mine:
            continue  # older torch versions record fewer settings; torch fills its defaults
        want, got = mine[key], saved[key]
        if not _same_setting(got, want):
            raise CheckpointError(f"{where}: {key} is {got!r}, but this run's AdamW has {want!r} (a corrupt or "
                                  "foreign file: the trainer never changes it)")
    for key in ("lr", "weight_decay"):
        v = saved.get(key)
        if not (_number(v) and math.isfinite(v) and v >= 0):
            raise CheckpointError(f"{where}: {key} is {v!r}; expected a finite number >= 0")


def _same_setting(got, want) -> bool:
    """Whether a setting read from JSON equals the optimizer's (tuples are lists there)."""
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(_same_setting(a, b) for a, b in zip(got, want)))
    if isinstance(want, bool) or want is None:
        return got is want
    return _number(got) and float(got) == float(want)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def optimizer_from_tensors(opt: torch.optim.Optimizer, tensors: Mapping, meta: Mapping) -> None:
    """Load into ``opt`` the state :func:`optimizer_to_tensors` made (check it first with
    :func:`check_optimizer_tensors`)."""
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        if not name.startswith("optim."):
            continue
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = t
    groups = json.loads(meta["param_groups"])
    opt.load_state_dict({"state": state, "param_groups": groups})



# --------------------------------------------------------------------------------------
# the run folder
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunDir:
    """A run folder at ``path``: where each of its files lives, and reading and writing them.

    ``RunDir(path)`` touches nothing on disk; each method reads or writes (atomically) the files
    it names. The trainer (:func:`circuitfade.train.train`), the ensemble, the sweep and
    :func:`circuitfade.store.open_run` all go through it.
    """

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    # ---- names
    @property
    def config_file(self) -> Path:
        """``RUN/config.json``."""
        return self.path / CONFIG_FILE

    @property
    def metrics_file(self) -> Path:
        """``RUN/metrics.csv``."""
        return self.path / METRICS_FILE

    @property
    def done_file(self) -> Path:
        """``RUN/done.json``."""
        return self.path / DONE_FILE

    @property
    def failed_file(self) -> Path:
        """``RUN/failed.json``."""
        return self.path / FAILED_FILE

    @property
    def lock_file(self) -> Path:
        """``RUN/.lock``."""
        return self.path / LOCK_FILE

    @property
    def checkpoints_dir(self) -> Path:
        """``RUN/checkpoints``."""
        return self.path / CKPT_DIR

    def weights_file(self, step: int) -> Path:
        """``RUN/checkpoints/step_XXXXXX.safetensors``."""
        return self.checkpoints_dir / checkpoint_name(step)

    def state_file(self, step: int) -> Path:
        """``RUN/checkpoints/step_XXXXXX.state.safetensors``."""
        return self.checkpoints_dir / checkpoint_name(step, state=True)

    # ---- config
    def has_config(self) -> bool:
        """Whether ``config.json`` is a file."""
        return self.config_file.is_file()

    def read_config_dict(self):
        """The parsed ``config.json``, or ``None`` if it is missing or unreadable."""
        if not self.config_file.is_file():
            return None
        try:
            return read_json(self.config_file)
        except CheckpointError:
            return None

    def read_config(self) -> RunConfig:
        """The run's :class:`RunConfig`; :class:`CheckpointError` naming ``config.json`` when it is
        missing, unreadable or not a run config."""
        try:
            return RunConfig.from_dict(read_json(self.config_file))
        except (ValueError, TypeError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{self.config_file}: not a circuitfade run config ({e})") from None

    def write_config(self, cfg: RunConfig) -> Path:
        """Write ``cfg`` as ``config.json``."""
        return write_json(self.config_file, cfg.to_dict())

    # ---- metrics
    def write_metrics(self, rows: list[dict]) -> None:
        """(Re)write ``metrics.csv`` with ``rows`` (all evaluation rows so far; nothing when empty)."""
        if not rows:
            return
        cols = list(dict.fromkeys(k for r in rows for k in r))
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        atomic_write(self.metrics_file, buf.getvalue().encode())

    def read_metrics(self):
        """``metrics.csv`` as a pandas DataFrame."""
        import pandas as pd

        return pd.read_csv(self.metrics_file)

    def has_metrics(self) -> bool:
        """Whether ``metrics.csv`` is a file."""
        return self.metrics_file.is_file()

    # ---- checkpoints
    def save_checkpoint(self, run: Run) -> Path:
        """Write ``step_XXXXXX.state.safetensors`` then ``step_XXXXXX.safetensors`` (each atomic);
        returns the weights file.

        Both record the step (``step`` metadata) and a checksum (:func:`circuitfade.io.checksum_of`);
        the state file also records the weights file's checksum (``weights_checksum``), so a
        state file is only ever resumed with the weights it was written with.
        """
        weights = {k: v.detach().contiguous().cpu() for k, v in run.model.state_dict().items()}
        weights_meta = {"step": str(run.step)}
        tensors, meta = optimizer_to_tensors(run.optimizer)
        tensors["rng.data"] = run.data_gen.get_state()
        tensors["rng.dropout"] = run.dropout_gen.get_state()
        meta.update(step=str(run.step), metrics=json.dumps(run.metrics), format=STATE_FORMAT,
                    weights_checksum=checksum_of(weights, weights_meta))
        save_tensors(self.state_file(run.step), tensors, metadata=meta)
        save_tensors(self.weights_file(run.step), weights, metadata=weights_meta)
        return self.weights_file(run.step)

    def checkpoint_files(self) -> dict[int, set[bool]]:
        """``step -> {is_state, ...}`` for the ``step_*.safetensors`` files of ``checkpoints/``.

        Refuses (:class:`CheckpointError` naming the file) a ``step_*.safetensors`` file the trainer
        would not have written: another name for a step (``step_40`` beside ``step_000040``, or
        alone), a name that is not ``step_<digits>``, or something that is not a regular file.
        """
        ck = self.checkpoints_dir
        if not ck.is_dir():
            return {}
        try:
            names = sorted(os.listdir(ck))
        except PermissionError:
            raise CheckpointError(f"{ck}: permission denied (cannot list the checkpoints)") from None
        found: dict[tuple[int, bool], str] = {}
        for name in names:
            if not (name.startswith("step_") and name.endswith(".safetensors")):
                continue
            parsed = parse_checkpoint_name(name)
            if parsed is None:
                raise CheckpointError(f"{ck / name}: not a checkpoint name the trainer writes (step_NNNNNN.safetensors "
                                      f"or step_NNNNNN.state.safetensors); move it out of {ck}")
            step, state = parsed
            if (step, state) in found:
                raise CheckpointError(f"{ck}: two files for step {step}: {found[(step, state)]} and {name} "
                                      "(a run folder holds one per step); remove one")
            if name != checkpoint_name(step, state):
                raise CheckpointError(f"{ck / name}: a step-{step} checkpoint under a name the trainer does not write "
                                      f"(it writes {checkpoint_name(step, state)}); rename or remove it")
            if not os.path.isfile(ck / name):
                raise CheckpointError(f"{ck / name}: not a regular file (a directory, or a dangling symlink)")
            found[(step, state)] = name
        out: dict[int, set[bool]] = {}
        for step, state in found:
            out.setdefault(step, set()).add(state)
        return out

    def complete_checkpoints(self) -> list[int]:
        """Steps whose weights and state files both exist (a lone state file is a checkpoint
        whose writer was killed before the weights; a lone weights file, a weights-only copy).

        Raises :class:`CheckpointError` naming a ``step_*.safetensors`` file the trainer would
        not have written (two files for one step, a name like ``step_40``)."""
        return sorted(s for s, kinds in self.checkpoint_files().items() if kinds == {False, True})

    def weight_files(self) -> dict[int, Path]:
        """``{step: file}`` of the weight files ``step_XXXXXX.safetensors`` (state files excluded),
        for reading the weights only (:func:`circuitfade.store.open_run`: a weights-only copy counts).

        Refused, naming the files (:class:`CheckpointError`): two files for one step
        (``step_40.safetensors`` beside ``step_000040.safetensors``), a step beyond ``int64``, and
        an entry with a weight file's name that is not a readable file (a dangling symlink, a
        symlink loop, a directory), so no checkpoint is silently left out or replaced.
        """
        ckpt_dir = self.checkpoints_dir
        if not ckpt_dir.is_dir():
            return {}
        found: dict[int, Path] = {}
        for f in sorted(ckpt_dir.iterdir()):
            parsed = parse_checkpoint_name(f.name)
            if parsed is None or parsed[1]:  # not a checkpoint name, or a state file
                continue
            check_file(f)
            step = parsed[0]
            if step > MAX_STEP:
                raise CheckpointError(f"{f}: step {step} is beyond int64 (the largest step is {MAX_STEP})")
            if step in found:
                raise CheckpointError(f"{ckpt_dir}: two weight files for step {step}: {found[step].name} and {f.name}; "
                                      "remove the one that does not belong")
            found[step] = f
        return dict(sorted(found.items()))

    def resume_steps(self, cfg: RunConfig) -> list[int]:
        """:meth:`complete_checkpoints` of a run folder about to be resumed under ``cfg``;
        :class:`CheckpointError` naming the last checkpoint when it lies past the run's end."""
        done = self.complete_checkpoints()
        if done and done[-1] > cfg.train.steps:
            raise CheckpointError(f"{self.weights_file(done[-1])}: step {done[-1]} is past "
                                  f"the run's end (steps={cfg.train.steps}); it is not this run's checkpoint")
        return done

    def load_checkpoint(self, run: Run, step: int) -> Run:
        """Restore model, optimizer, generators and metrics of ``run`` from ``step``'s checkpoint.

        Nothing is restored unless both files are the trainer's for this run at this step:
        the name's step, the ``step`` metadata of both files, the weights' names, shapes and
        exact dtypes (the model's), finite parameters, a complete optimizer state of the
        model's shapes, both generator states, the metrics JSON, the checksums (where
        recorded) and the state file's record of its weights must all agree; otherwise
        :class:`CheckpointError` naming the file and what is wrong.
        """
        wfile, sfile = self.weights_file(step), self.state_file(step)
        weights, wmeta = _read_safetensors(wfile)
        _check_weights(run, weights, wmeta, wfile, step)
        if not sfile.exists():
            raise CheckpointError(f"{sfile}: missing optimizer/RNG state")
        tensors, meta = _read_safetensors(sfile)
        metrics = _check_state(run, tensors, meta, sfile, step, wmeta, wfile)
        run.model.load_state_dict(weights, strict=True)
        try:
            optimizer_from_tensors(run.optimizer, tensors, meta)
        except (ValueError, KeyError, RuntimeError) as e:
            raise CheckpointError(f"{sfile}: the optimizer state does not load ({e})") from None
        apply_hparams(run.optimizer, run.config.train)
        run.data_gen.set_state(tensors["rng.data"])
        run.dropout_gen.set_state(tensors["rng.dropout"])
        run.step = step
        run.metrics = metrics
        return run

    # ---- the folder's state, records
    @staticmethod
    def is_scratch(name: str) -> bool:
        """Files that do not make a folder "not empty": the lock and atomic_write's temp files."""
        return name == LOCK_FILE or is_temp_file(name)

    def clean_scratch(self) -> None:
        """Remove :func:`~circuitfade.io.atomic_write` temp files (``.NAME.XXXXXXXX.cftmp``) left by a
        killed writer, and nothing else (call with the run lock held)."""
        for folder in (self.path, self.checkpoints_dir):
            if folder.is_dir():
                for f in folder.iterdir():
                    if is_temp_file(f.name) and f.is_file():
                        f.unlink(missing_ok=True)

    def state(self, cfg: RunConfig) -> str:
        """'new', 'resume', 'done' or 'failed', reading only; refuses a folder holding something else."""
        run_dir = self.path
        if run_dir.exists() and not run_dir.is_dir():
            raise ValueError(f"{run_dir}: exists and is not a directory (a run directory is a folder)")
        cfg_file = self.config_file
        if cfg_file.is_file():
            try:
                existing = RunConfig.from_dict(read_json(cfg_file))
            except (ValueError, TypeError) as e:
                raise CheckpointError(f"{cfg_file}: not a circuitfade run config ({e})") from None
            if not existing.same_run(cfg):
                raise ValueError(f"{run_dir} already holds a different run; choose another --out or delete it")
            if self.is_done():
                return "done"
            return "failed" if self.is_failed() else "resume"
        if run_dir.is_dir() and any(not self.is_scratch(f.name) for f in run_dir.iterdir()):
            raise ValueError(f"{run_dir} exists, is not empty and has no config.json; refusing to write into it")
        return "new"

    def is_done(self) -> bool:
        """Whether ``done.json`` is a file (the run finished)."""
        return self.done_file.is_file()

    def is_failed(self) -> bool:
        """Whether ``failed.json`` is a file (the run diverged)."""
        return self.failed_file.is_file()

    def read_done(self) -> dict:
        """The parsed ``done.json``: ``{"step", "final"}``."""
        return read_json(self.done_file)

    def finish(self, run: Run) -> Path:
        """Write ``done.json``: the step reached and the last evaluation row."""
        final = run.metrics[-1] if run.metrics else {}
        return write_json(self.done_file, {"step": run.step, "final": final})

    def record_failure(self, err: TrainingDiverged) -> Path:
        """Write ``failed.json``: the step and error of a diverged run."""
        return write_json(self.failed_file, {"step": err.step, "error": err.error})

    def raise_recorded_failure(self) -> None:
        """Raise the :class:`TrainingDiverged` recorded in ``failed.json``."""
        rec = read_json(self.failed_file)
        err = TrainingDiverged(int(rec.get("step", -1)), str(rec.get("error", "?")))
        err.args = (f"{err} (recorded in {self.failed_file}; delete that file to try again)",)
        raise err


# --------------------------------------------------------------------------------------
# checking what a checkpoint file holds
# --------------------------------------------------------------------------------------
def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of a safetensors file; :class:`CheckpointError` naming ``path``
    for a missing, unreadable (saying "permission denied" when it is), truncated or foreign file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint file not found") from None
    except PermissionError:
        raise CheckpointError(f"{path}: permission denied (the checkpoint is not readable)") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        n = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + n]).get("__metadata__") or {}
        tensors = load_safetensors_bytes(data)
    except Exception as e:  # SafetensorError, JSONDecodeError, UnicodeDecodeError, AttributeError, ...
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or foreign?): {e}") from None
    return tensors, meta


def _recorded_step(meta: Mapping[str, str], path: Path, step: int) -> None:
    rec = meta.get("step")
    if rec is None:
        raise CheckpointError(f"{path}: records no step ('step' metadata); the trainer writes it in every checkpoint")
    if not (isinstance(rec, str) and rec.isdigit() and int(rec) == step):
        raise CheckpointError(f"{path}: records step {rec!r} but is named for step {step}")


def _check_weights(run: Run, weights: Mapping[str, torch.Tensor], meta: Mapping[str, str], path: Path,
                   step: int) -> None:
    """The weights file of step ``step`` is one the trainer wrote for ``run``'s model: step
    metadata, names, shapes, exact dtypes, finite parameters, checksum."""
    _recorded_step(meta, path, step)
    expected = run.model.state_dict()
    check_state_dict(weights, expected, str(path))
    dtypes = [f"{k}: file {weights[k].dtype} vs model {v.dtype}" for k, v in expected.items() if weights[k].dtype != v.dtype]
    if dtypes:
        raise CheckpointError(f"{path}: dtype mismatch in {len(dtypes)} tensors: {'; '.join(dtypes[:3])} "
                              "(resuming would continue a different model)")
    for name, _ in run.model.named_parameters():  # (buffers may hold -inf masks)
        if not bool(torch.isfinite(weights[name]).all()):
            raise CheckpointError(f"{path}: {name} holds non-finite values: a corrupt checkpoint (the trainer "
                                  "never writes non-finite weights), not a diverged run")
    verify_checksum(path, tensors=weights, metadata=meta)


def _gate_logit(name: str, priors) -> bool:
    return any(name.endswith(f"gate_{p}_logit") for p in priors)


def _check_state(run: Run, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, str], path: Path, step: int,
                 weights_meta: Mapping[str, str], weights_path: Path) -> list[dict]:
    """The state file of step ``step`` is one the trainer wrote with these weights; returns its metrics."""
    if meta.get("format") != STATE_FORMAT:
        raise CheckpointError(f"{path}: not a circuitfade state file (no 'format': '{STATE_FORMAT}' metadata)")
    _recorded_step(meta, path, step)
    try:
        metrics = json.loads(meta["metrics"])
    except KeyError:
        raise CheckpointError(f"{path}: no 'metrics' metadata (the evaluation rows so far)") from None
    except ValueError as e:
        raise CheckpointError(f"{path}: 'metrics' metadata is not valid JSON ({e})") from None
    if not isinstance(metrics, list) or not all(isinstance(m, dict) and isinstance(m.get("step"), int)
                                                and 0 <= m["step"] <= step for m in metrics):
        raise CheckpointError(f"{path}: 'metrics' metadata should be a list of evaluation rows with steps <= {step}")
    for name in ("rng.data", "rng.dropout"):
        want = torch.Generator().get_state()
        t = tensors.get(name)
        if t is None:
            raise CheckpointError(f"{path}: missing tensor {name} (a random generator's state)")
        if t.dtype != torch.uint8 or tuple(t.shape) != tuple(want.shape):
            raise CheckpointError(f"{path}: {name} is {tuple(t.shape)} {t.dtype}, not a generator state "
                                  f"({tuple(want.shape)} uint8)")
        try:
            torch.Generator().set_state(t)
        except RuntimeError as e:
            raise CheckpointError(f"{path}: {name} is not a valid generator state ({e})") from None
    other = sorted(k for k in tensors if not k.startswith("optim.") and k not in ("rng.data", "rng.dropout"))
    if other:
        raise CheckpointError(f"{path}: unexpected tensors {other[:4]} in a state file")
    check_optimizer_tensors(run.optimizer, tensors, meta, str(path), step)
    if not verify_checksum(path, tensors=tensors, metadata=meta) and step > 0:
        # no checksum to vouch for completeness: after the first step every parameter but the
        # gate logits (unused under fixed or scheduled gates) has optimizer state
        priors = run.model.cfg.priors
        required = tuple(i for i, (n, _) in enumerate(run.model.named_parameters()) if not _gate_logit(n, priors))
        check_optimizer_tensors(run.optimizer, tensors, meta, str(path), step, required)
    bound = meta.get("weights_checksum")
    if bound is not None and weights_meta.get(CHECKSUM_KEY) is None:
        raise CheckpointError(f"{weights_path}: records no checksum, but its state file {path.name} records the "
                              "weights' checksum: the weights file was altered after it was written")
    if bound is not None and bound != weights_meta.get(CHECKSUM_KEY):
        raise CheckpointError(f"{path}: written with other weights than {weights_path.name} (its "
                              "'weights_checksum' does not match); the two files of a checkpoint belong together")
    return metrics
