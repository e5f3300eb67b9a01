"""Local Hugging Face model directories: :func:`load_hf_local` and series of revisions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.nn as nn

from circuitfade import compat
from circuitfade.io import CheckpointError

from .runs import _RUN_KEYS, _read_config_json
from .series import CheckpointSeries, Snapshot

SUPPORTED_HF_ARCHITECTURES: tuple[str, ...] = ("GPTNeoXForCausalLM", "GPT2LMHeadModel")
"""Hugging Face ``architectures[0]`` values :func:`load_hf_local` converts (tested to 1e-4 on logits)."""

_HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


# --------------------------------------------------------------------------------------
# local Hugging Face models
# --------------------------------------------------------------------------------------
def _hf_config(model_dir: Path) -> dict | None:
    """The parsed ``config.json`` if ``model_dir`` looks like a transformers model directory."""
    d = _read_config_json(model_dir)
    if isinstance(d, dict) and ("model_type" in d or "architectures" in d) and not _RUN_KEYS <= set(d):
        return d
    return None


def _check_hf_dir(model_dir: Path, d: Mapping) -> str:
    arch = (d.get("architectures") or [None])[0]
    if arch not in SUPPORTED_HF_ARCHITECTURES:
        raise CheckpointError(
            f"{model_dir}: unsupported Hugging Face architecture {arch!r} (model_type "
            f"{d.get('model_type')!r}); supported: {list(SUPPORTED_HF_ARCHITECTURES)}"
        )
    if not any((model_dir / w).is_file() for w in _HF_WEIGHT_FILES):
        raise CheckpointError(f"{model_dir}: no weights (expected one of {list(_HF_WEIGHT_FILES)})")
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
    d = _hf_config(model_dir)
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
        try:
            hf = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True, dtype=dtype)
        except Exception as e:
            raise CheckpointError(f"{model_dir}: transformers could not load the model: {e}") from None
        return hf.eval()

    return compat.model_from_hf(load_hf, model_dir, d, arch, device=device, dtype=dtype, process=process,
                                tokenizer=tokenizer)


def _hf_series(dirs: list[Path], steps: list[int], device, metadata, source: str) -> CheckpointSeries:
    archs = set()
    for m in dirs:
        archs.add(_check_hf_dir(m, _hf_config(m)))  # eager: config and weights present

    def loader(m: Path) -> Callable[[], nn.Module]:
        return lambda: load_hf_local(m, device=device or "cpu")

    snaps = [Snapshot(s, loader(m), str(m)) for m, s in zip(dirs, steps)]
    if len(archs) == 1:
        metadata = {"architecture": archs.pop(), **metadata}
    return CheckpointSeries(snaps, metadata, source=source)
