"""The run directory on disk: checkpoints (weights + optimizer/RNG state), ``metrics.csv``,
``done.json`` / ``failed.json``, and the rules for what a directory may hold.

::

    RUN/
      config.json                        everything needed to rebuild the run
      metrics.csv                        step, gates, train loss, eval under each gate condition
      checkpoints/step_000300.safetensors            model weights
      checkpoints/step_000300.state.safetensors      optimizer + RNG state (to resume)
      done.json                          written last, when the run has finished

Every file is written atomically (:mod:`circuitfade.io`) and every checkpoint file records
its step and a checksum. A checkpoint is resumed only when it is verifiably the trainer's
for this run at that step (:func:`load_checkpoint`); a folder holding a second file for a
step, or a step file under another name, is refused (:func:`complete_checkpoints`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load as load_safetensors_bytes

from circuitfade.io import (
    CHECKSUM_KEY,
    CheckpointError,
    atomic_write,
    check_state_dict,
    checksum_of,
    is_temp_file,
    read_json,
    save_tensors,
    verify_checksum,
    write_json,
)
from circuitfade.train.config import RunConfig, TrainingDiverged
from circuitfade.train.lock import LOCK_FILE
from circuitfade.train.state import (
    Run,
    apply_hparams,
    check_optimizer_tensors,
    optimizer_from_tensors,
    optimizer_to_tensors,
)

__all__ = ["CKPT_DIR", "STATE_FORMAT", "checkpoint_name", "parse_checkpoint_name", "save_checkpoint",
           "complete_checkpoints", "load_checkpoint", "resume_steps", "write_metrics", "read_metrics", "run_steps", "dir_state", "clean_scratch",
           "raise_recorded_failure", "finish_run"]

CKPT_DIR = "checkpoints"
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


def save_checkpoint(run: Run, run_dir: Path) -> Path:
    """Write ``step_XXXXXX.state.safetensors`` then ``step_XXXXXX.safetensors`` (each atomic).

    Both record the step (``step`` metadata) and a checksum (:func:`circuitfade.io.checksum_of`);
    the state file also records the weights file's checksum (``weights_checksum``), so a
    state file is only ever resumed with the weights it was written with.
    """
    ck = Path(run_dir) / CKPT_DIR
    weights = {k: v.detach().contiguous().cpu() for k, v in run.model.state_dict().items()}
    weights_meta = {"step": str(run.step)}
    tensors, meta = optimizer_to_tensors(run.optimizer)
    tensors["rng.data"] = run.data_gen.get_state()
    tensors["rng.dropout"] = run.dropout_gen.get_state()
    meta.update(step=str(run.step), metrics=json.dumps(run.metrics), format=STATE_FORMAT,
                weights_checksum=checksum_of(weights, weights_meta))
    save_tensors(ck / checkpoint_name(run.step, state=True), tensors, metadata=meta)
    save_tensors(ck / checkpoint_name(run.step), weights, metadata=weights_meta)
    return ck / checkpoint_name(run.step)


def _checkpoint_files(run_dir: Path) -> dict[int, set[bool]]:
    """``step -> {is_state, ...}`` for the ``step_*.safetensors`` files of ``run_dir/checkpoints``.

    Refuses (:class:`CheckpointError` naming the file) a ``step_*.safetensors`` file the trainer
    would not have written: another name for a step (``step_40`` beside ``step_000040``, or
    alone), a name that is not ``step_<digits>``, or something that is not a regular file.
    """
    ck = Path(run_dir) / CKPT_DIR
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


def complete_checkpoints(run_dir: Path) -> list[int]:
    """Steps whose weights and state files both exist (a lone state file is a checkpoint
    whose writer was killed before the weights; a lone weights file, a weights-only copy).

    Raises :class:`CheckpointError` naming a ``step_*.safetensors`` file the trainer would
    not have written (two files for one step, a name like ``step_40``)."""
    return sorted(s for s, kinds in _checkpoint_files(Path(run_dir)).items() if kinds == {False, True})


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


def resume_steps(cfg: RunConfig, run_dir: Path) -> list[int]:
    """:func:`complete_checkpoints` of a run directory about to be resumed under ``cfg``;
    :class:`CheckpointError` naming the last checkpoint when it lies past the run's end."""
    done = complete_checkpoints(run_dir)
    if done and done[-1] > cfg.train.steps:
        raise CheckpointError(f"{Path(run_dir) / CKPT_DIR / checkpoint_name(done[-1])}: step {done[-1]} is past "
                              f"the run's end (steps={cfg.train.steps}); it is not this run's checkpoint")
    return done


def load_checkpoint(run: Run, run_dir: Path, step: int) -> Run:
    """Restore model, optimizer, generators and metrics of ``run`` from ``step``'s checkpoint.

    Nothing is restored unless both files are the trainer's for this run at this step:
    the name's step, the ``step`` metadata of both files, the weights' names, shapes and
    exact dtypes (the model's), finite parameters, a complete optimizer state of the
    model's shapes, both generator states, the metrics JSON, the checksums (where
    recorded) and the state file's record of its weights must all agree; otherwise
    :class:`CheckpointError` naming the file and what is wrong.
    """
    ck = Path(run_dir) / CKPT_DIR
    wfile, sfile = ck / checkpoint_name(step), ck / checkpoint_name(step, state=True)
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


def write_metrics(run_dir: Path, rows: list[dict]) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(Path(run_dir) / "metrics.csv", buf.getvalue().encode())


def _is_scratch(name: str) -> bool:
    """Files that do not make a directory "not empty": the lock and atomic_write's temp files."""
    return name == LOCK_FILE or is_temp_file(name)


def clean_scratch(run_dir: Path) -> None:
    """Remove :func:`~circuitfade.io.atomic_write` temp files (``.NAME.XXXXXXXX.cftmp``) left by a
    killed writer, and nothing else (call with the run lock held)."""
    for folder in (run_dir, run_dir / CKPT_DIR):
        if folder.is_dir():
            for f in folder.iterdir():
                if is_temp_file(f.name) and f.is_file():
                    f.unlink(missing_ok=True)


def dir_state(cfg: RunConfig, run_dir: Path) -> str:
    """'new', 'resume', 'done' or 'failed', reading only; refuses a directory holding something else."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir}: exists and is not a directory (a run directory is a folder)")
    cfg_file = run_dir / "config.json"
    if cfg_file.is_file():
        try:
            existing = RunConfig.from_dict(read_json(cfg_file))
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{cfg_file}: not a circuitfade run config ({e})") from None
        if not existing.same_run(cfg):
            raise ValueError(f"{run_dir} already holds a different run; choose another --out or delete it")
        if (run_dir / "done.json").is_file():
            return "done"
        return "failed" if (run_dir / "failed.json").is_file() else "resume"
    if run_dir.is_dir() and any(not _is_scratch(f.name) for f in run_dir.iterdir()):
        raise ValueError(f"{run_dir} exists, is not empty and has no config.json; refusing to write into it")
    return "new"


def raise_recorded_failure(run_dir: Path) -> None:
    rec = read_json(run_dir / "failed.json")
    err = TrainingDiverged(int(rec.get("step", -1)), str(rec.get("error", "?")))
    err.args = (f"{err} (recorded in {run_dir / 'failed.json'}; delete that file to try again)",)
    raise err


def finish_run(run: Run, run_dir: Path) -> None:
    final = run.metrics[-1] if run.metrics else {}
    write_json(Path(run_dir) / "done.json", {"step": run.step, "final": final})


def read_metrics(run_dir: str | Path):
    """``metrics.csv`` as a pandas DataFrame."""
    import pandas as pd

    return pd.read_csv(Path(run_dir) / "metrics.csv")


def run_steps(run_dir: str | Path) -> list[int]:
    """Checkpoint steps present (complete) in a run directory."""
    return complete_checkpoints(Path(run_dir))

