"""Local Hugging Face model directories: :func:`load_hf_local` and series of revisions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.nn as nn

from circuitfade import compat
from circuitfade.io import CheckpointError, check_file, read_header, read_json

from .runs import RUN_KEYS, read_config_json
from .series import CheckpointSeries, Snapshot

SUPPORTED_HF_ARCHITECTURES: tuple[str, ...] = ("GPTNeoXForCausalLM", "GPT2LMHeadModel")
"""Hugging Face ``architectures[0]`` values :func:`load_hf_local` converts (tested to 1e-4 on logits)."""

HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


# --------------------------------------------------------------------------------------
# local Hugging Face models
# --------------------------------------------------------------------------------------
def hf_config(model_dir: Path) -> dict | None:
    """The parsed ``config.json`` if ``model_dir`` looks like a transformers model directory."""
    d = read_config_json(model_dir)
    if isinstance(d, dict) and ("model_type" in d or "architectures" in d) and not RUN_KEYS <= set(d):
        return d
    return None


def _check_hf_dir(model_dir: Path, d: Mapping) -> str:
    arch = (d.get("architectures") or [None])[0]
    if arch not in SUPPORTED_HF_ARCHITECTURES:
        raise CheckpointError(
            f"{model_dir}: unsupported Hugging Face architecture {arch!r} (model_type "
            f"{d.get('model_type')!r}); supported: {list(SUPPORTED_HF_ARCHITECTURES)}"
        )
    if not any((model_dir / w).is_file() for w in HF_WEIGHT_FILES):
        raise CheckpointError(f"{model_dir}: no weights (expected one of {list(HF_WEIGHT_FILES)})")
    return arch


def load_hf_local(
    model_dir: str | Path,
    device: str = "cpu",
    *,
    process: bool = False,
    dtype: torch.dtype = torch.float32,
    tokenizer=None,
) -> nn.Module:
    """A TransformerLens model from a local ``transformers`` model directory, offline.

    ``model_dir`` holds ``config.json`` and weights written by ``save_pretrained``
    (e.g. one Pythia revision). Steps: ``AutoModelForCausalLM.from_pretrained(model_dir,
    local_files_only=True)``; TransformerLens's own config conversion
    (``loading_from_pretrained.get_pretrained_model_config``) run on a copy of
    ``config.json`` in a neutral temporary folder (TL picks some architectures by
    substrings of the *name*, such as "llama", so the real path is never shown to it)
    and its weight converter (``get_pretrained_state_dict(..., hf_model=...)``,
    e.g. ``convert_neox_weights``); then ``load_and_process_state_dict``. That gives
    a ``HookedTransformer`` on TransformerLens 3; on TransformerLens 4 the loaded model
    is wrapped by ``TransformerBridge.boot_transformers(model_dir, hf_model=...)`` in
    compatibility mode instead (same hook names; see :func:`circuitfade.compat.model_from_hf`).

    ``process=False`` (default) keeps the weights as trained (the
    ``from_pretrained_no_processing`` convention: logits equal the HF model's);
    ``process=True`` applies TL's default ``fold_ln``, ``center_writing_weights``,
    ``center_unembed``, ``fold_value_biases`` (same log-probs, different weights).
    A tokenizer is loaded from ``model_dir`` when tokenizer files are there (or pass
    ``tokenizer=``); otherwise the model takes token ids only. Architectures:
    :data:`SUPPORTED_HF_ARCHITECTURES`; anything else raises :class:`CheckpointError`.
    Requires the ``transformers`` package.
    """
    model_dir = Path(model_dir)
    d = hf_config(model_dir)
    if d is None:
        raise CheckpointError(
            f"{model_dir}: not a local Hugging Face model directory (expected config.json with "
            "'model_type'/'architectures' and weights from save_pretrained)"
        )
    arch = _check_hf_dir(model_dir, d)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"loading {model_dir} needs the 'transformers' package: {e}") from None

    if tokenizer is None and any((model_dir / t).is_file() for t in _HF_TOKENIZER_FILES):
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        except Exception as e:
            raise CheckpointError(f"{model_dir}: tokenizer files present but unreadable: {e}") from None

    def load_hf() -> nn.Module:
        try:  # mismatches are collected (not raised with a pointer to a log) and refused below, with names
            hf, info = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=dtype,
                                                            ignore_mismatched_sizes=True, output_loading_info=True)
        except Exception as e:
            raise CheckpointError(f"{model_dir}: transformers could not load the model: {e}") from None
        mismatched = [f"{k}: weights {tuple(a)} vs config {tuple(b)}" for k, a, b in info.get("mismatched_keys", [])]
        missing = sorted(info.get("missing_keys", []))
        if mismatched or missing:
            parts = ([f"{len(mismatched)} tensors do not fit config.json ({'; '.join(mismatched[:3])})"] if mismatched
                     else []) + ([f"{len(missing)} tensors missing from the weights ({missing[:3]})"] if missing else [])
            raise CheckpointError(f"{model_dir}: the weights do not fit its config.json: {', '.join(parts)}")
        return hf.eval()

    return compat.model_from_hf(load_hf, model_dir, d, arch, device=device, dtype=dtype, process=process,
                                tokenizer=tokenizer)


def hf_weight_files(model_dir: Path) -> list[Path]:
    """The weight files of a ``save_pretrained`` folder: the shards an index names
    (``model.safetensors.index.json``, ``pytorch_model.bin.index.json``), else
    ``model.safetensors`` or ``pytorch_model.bin``; :class:`CheckpointError` naming a
    missing shard or an unreadable index."""
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        f = model_dir / index
        if f.is_file():
            d = read_json(f)
            try:
                shards = sorted(set(d["weight_map"].values()))
            except (KeyError, TypeError, AttributeError):
                raise CheckpointError(f"{f}: expected a shard index with a 'weight_map'") from None
            return [check_file(model_dir / s) for s in shards]
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / single).exists() or (model_dir / single).is_symlink():
            return [check_file(model_dir / single)]
    raise CheckpointError(f"{model_dir}: no weights (expected one of {list(HF_WEIGHT_FILES)})")


def check_hf_weights(model_dir: Path) -> None:
    """Read the header of every weight file of ``model_dir`` (:func:`hf_weight_files`), so a
    truncated, foreign or unreadable ``model.safetensors`` / ``pytorch_model.bin`` / shard fails
    now, naming the file (:class:`CheckpointError`). Names and shapes are checked against the
    config only when the revision is loaded (by ``transformers``)."""
    for f in hf_weight_files(model_dir):
        read_header(f)


def check_series_weights(series: CheckpointSeries) -> None:
    """:func:`check_hf_weights` for every snapshot of ``series`` that is a local Hugging Face
    model folder (other sources are checked when attached), so a truncated revision fails
    before any work, naming its file. ``circuitfade analyze`` runs it first; a library user
    tracing a folder of revisions can too (or let
    :func:`~circuitfade.store.revisions.check_integrity` report broken revisions and skip them)."""
    for snap in series.snapshots:
        p = Path(snap.source)
        if p.is_dir() and hf_config(p) is not None:
            check_hf_weights(p)


def hf_series(dirs: list[Path], steps: list[int], device, metadata, source: str) -> CheckpointSeries:
    """A series over local Hugging Face model folders (``dirs``, one per step): each folder's
    config is checked now and its weight files must exist; a revision is converted (with
    :func:`load_hf_local`) when its snapshot is loaded."""
    archs = set()
    for m in dirs:
        archs.add(_check_hf_dir(m, hf_config(m)))  # eager: config present and read, weights present

    def loader(m: Path) -> Callable[[], nn.Module]:
        return lambda: load_hf_local(m, device=device or "cpu")

    snaps = [Snapshot(s, loader(m), str(m)) for m, s in zip(dirs, steps)]
    if len(archs) == 1:
        metadata = {"architecture": archs.pop(), **metadata}
    return CheckpointSeries(snaps, metadata, source=source)
