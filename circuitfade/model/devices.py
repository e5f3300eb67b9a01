"""Where models run: ``"cpu"``, ``"cuda"`` (or ``"cuda:N"``), ``"mps"`` or ``"auto"``.

:func:`resolve_device` turns a name into a ``torch.device`` and fails with one
clear line when the device is not available here. ``"auto"`` picks CUDA, then
MPS, then the CPU. Data are always drawn on the CPU generator and moved to the
device afterwards, and checkpoints are always written from CPU tensors, so a run's
batches and files do not depend on where it trained (its weights do, up to float
rounding: see the README's "Devices" notes).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys

import torch

__all__ = ["DEVICES", "check_device_name", "resolve_device", "to_device", "keep_freed_memory",
           "KEEP_HEAP_ENV", "HEAP_MMAP_THRESHOLD", "HEAP_TRIM_THRESHOLD", "machine"]

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


KEEP_HEAP_ENV = "CIRCUITFADE_KEEP_HEAP"
"""Set it to ``0`` to leave the C allocator's settings alone (see :func:`keep_freed_memory`)."""
HEAP_MMAP_THRESHOLD = 32 * 2**20
"""Blocks up to this size (bytes; glibc's largest allowed value) come from the heap, not fresh ``mmap`` s."""
HEAP_TRIM_THRESHOLD = 512 * 2**20
"""Free memory at the top of the heap beyond this many bytes is returned to the system."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
_heap_kept: bool | None = None


def keep_freed_memory() -> bool:
    """Let the C allocator reuse freed tensor memory instead of returning it to the system
    (glibc on Linux; elsewhere nothing is done). Returns whether the setting is in force.

    Torch allocates CPU tensors with ``malloc``; glibc serves blocks above its mmap threshold
    (128 KiB, raised on the fly up to the size of blocks freed) from fresh ``mmap`` s and
    trims the heap when its top is free, so a loop that allocates and frees tensors of a few
    MiB (an evaluation at batch 128, a stacked ensemble step) touches new pages every pass:
    one page fault per 4 KiB, which costs microseconds each inside a virtual machine. With
    ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` and ``mallopt(M_TRIM_THRESHOLD, 512 MiB)`` those
    blocks are reused. The arithmetic is unchanged (same kernels, same results); the process
    keeps up to :data:`HEAP_TRIM_THRESHOLD` of freed memory for reuse. The trainers
    (:func:`~circuitfade.train.fit`, :func:`~circuitfade.train.ensemble.fit_ensemble`) and
    :func:`~circuitfade.store.trace` call it once per process; ``CIRCUITFADE_KEEP_HEAP=0`` turns it off.
    """
    global _heap_kept
    if _heap_kept is not None:
        return _heap_kept
    _heap_kept = False
    if os.environ.get(KEEP_HEAP_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library symbols here (static or unusual builds)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _heap_kept = mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD,
                                                                                  HEAP_TRIM_THRESHOLD) == 1
    return _heap_kept


def machine() -> dict:
    """What a speed figure measured here depends on: CPU model, cores, torch version, its BLAS and
    the vector instructions its kernels use (``ATEN_CPU_CAPABILITY`` may lower them), and the GPU
    if one is used. Benchmarks and calibrations record this beside every figure."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    info = {"cpu": cpu, "cores": os.cpu_count() or 1, "torch": torch.__version__,
            "blas": blas.group(1) if blas else "unknown",
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", ""), "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info
