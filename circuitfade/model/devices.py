"""Where models run: ``"cpu"``, ``"cuda"`` (or ``"cuda:N"``), ``"mps"`` or ``"auto"``.

:func:`resolve_device` turns a name into a ``torch.device`` and fails with one
clear line when the device is not available here. ``"auto"`` picks CUDA, then
MPS, then the CPU. Data are always drawn on the CPU generator and moved to the
device afterwards, and checkpoints are always written from CPU tensors, so a run's
batches and files do not depend on where it trained (its weights do, up to float
rounding: see the README's "Devices" notes).
"""

from __future__ import annotations

import re

import torch

__all__ = ["DEVICES", "check_device_name", "resolve_device", "to_device"]

DEVICES = ("cpu", "cuda", "mps", "auto")
_NAME = re.compile(r"^(cpu|cuda|mps|auto)(:\d+)?$")


def check_device_name(name: str) -> str:
    """``name`` if it is a device name this package understands, else ``ValueError``."""
    if not isinstance(name, str) or not _NAME.match(name) or (name.startswith(("cpu:", "auto:", "mps:"))):
        raise ValueError(f"device must be one of {DEVICES} (or 'cuda:N'), got {name!r}")
    return name


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve_device(name: str | torch.device | None = "cpu") -> torch.device:
    """The ``torch.device`` for ``name`` (``None`` means ``"cpu"``); ``ValueError`` if unavailable."""
    if isinstance(name, torch.device):
        name = str(name)
    name = check_device_name("cpu" if name is None else name)
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but CUDA is not available here "
                             f"(torch {torch.__version__}); use device='cpu' or 'auto'")
        idx = int(name.split(":")[1]) if ":" in name else 0
        if idx >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist")
    if name == "mps" and not _mps_available():
        raise ValueError("device 'mps' requested but MPS is not available here; use device='cpu' or 'auto'")
    return torch.device(name)


def to_device(model: torch.nn.Module, device: str | torch.device | None) -> torch.nn.Module:
    """``model`` moved (in place) to :func:`resolve_device` of ``device``; ``None`` leaves it.

    A ``HookedTransformer`` or soft-prior model is moved with its ``cfg.device`` updated and
    without its progress message.
    """
    if device is None:
        return model
    target = resolve_device(device)
    if getattr(model, "supports_positions", False) or _is_hooked_transformer(model):
        # HookedTransformer.to and the soft-prior model's to also update cfg.device
        return model.to(target, print_details=False)
    return model.to(target)


def _is_hooked_transformer(model) -> bool:
    from circuitfade.compat import is_tl4

    if is_tl4():
        return False
    from transformer_lens import HookedTransformer

    return isinstance(model, HookedTransformer)
