"""Checkpoint series: circuitfade runs and anyone's own checkpoints, traced the same way.

A :class:`CheckpointSeries` is a lazy, ordered sequence of ``(step, model)``
snapshots. Each snapshot is a :class:`Snapshot` (a step, a zero-argument loader
and a ``source`` string for error messages); a model is built only when asked
for, so iterating holds one model in memory at a time::

    series = attach("runs/fade600-s0")          # a circuitfade run directory
    series = attach("my_ckpts/", config=cfg)    # your HookedTransformer state dicts
    series = attach("pythia-revisions/")        # local Hugging Face model folders
    series = attach([model_a, model_b])         # models already in memory

    for step, model in series.range(0, 1200):   # eval-mode models, loaded one by one
        ...
    df = trace(series, {"loss": loss_fn, "prev": metric(prev_token_score, inputs=("model", "batch"))}, task)

Source kinds :func:`attach` accepts (dispatched in this order, each to its own
constructor: :func:`from_run`, :func:`from_hf`, :func:`from_state_dicts`,
:func:`from_models`):

1. a **circuitfade run directory** (``config.json`` with the run keys and a
   ``checkpoints/`` folder; :func:`open_run`);
2. a **single local Hugging Face model directory** (``config.json`` with
   ``model_type``/``architectures`` and weights written by ``save_pretrained``);
3. a **folder of Hugging Face model directories**, one per revision
   (``step1000/``, ``step2000/``, ...; :func:`load_hf_local`);
4. a **folder of state-dict files** (``.pt``/``.pth``/``.bin``/``.safetensors``, and
   PyTorch Lightning ``.ckpt``) of a TransformerLens model (or ``SoftPriorTransformer``) whose config is given
   with ``config=`` or sits next to them as ``config.json``; a single such file; a
   list of such files; a dict ``{step: file}``;
5. **in-memory models**: one model, a list/tuple (steps ``0..n-1`` unless
   ``steps=``), or a dict ``{step: model}``.

Steps of files and folders come from ``steps=`` if given; else from the file itself
when it records one (a full training checkpoint's ``step`` entry, which must agree
with the name); else from the name (:func:`step_from_name`): the number after
``step``/``iter`` (``step100_acc0.98.pt`` -> 100, ``epoch3_step100.pt`` -> 100), else
after ``checkpoint``/``ckpt``/``model`` (``ckpt-100``, ``model_100.pt``,
``checkpoint-100/``), else the only other whole number (``revision-2000/`` -> 2000,
``model_2L_300.pt`` -> 300: digits that belong to a word, ``2L``, ``v2``, ``bf16``, are never
a step; ``1k``/``2.5k`` are 1000/2500). A name where that is ambiguous (``run_3_seed_1.pt``)
or that states only an epoch (``checkpoint_epoch_3.pt``, unless ``steps_per_epoch=``) is
refused with a message showing ``steps=`` and ``step_pattern=`` (a regex whose group is the
step); a file whose name states no step beside numbered ones (``model_final.pt``) is left
out with a warning. Files are ordered by the natural sort of their names;
:data:`NAMING_SCHEMES` lists the tested schemes.

Validation is **eager and cheap**: :func:`attach` reads every state-dict file's
*header* (names, shapes and dtypes; safetensors header or a memory-mapped weights-only
``torch.load``, no tensor data) and checks it against the config, and reads every
Hugging Face ``config.json``, so a foreign, truncated, pickled-code, wrongly-shaped or
re-typed (any other dtype than the config's) state-dict file, a dangling symlink or a directory under a
checkpoint's name fails at attach time with a :class:`~circuitfade.io.CheckpointError`
naming the file. The one exception: the weight files of Hugging Face revision folders are
read when each revision is loaded (so a folder of public revisions with a broken one still
attaches, for :func:`~circuitfade.store.revisions.sound_revisions` to report and skip);
:func:`check_series_weights` reads their headers up front, as ``circuitfade analyze`` does.
Weights are read in full (and checked again, NaN and inf refused) only when a snapshot is loaded. Nothing here touches the network: Hugging Face folders are
read with ``local_files_only=True`` and a hub id is never passed anywhere.

:func:`trace` maps metric functions over a series into one tidy DataFrame with
columns ``step, layer, head, metric, value, se, lo, hi, note`` plus the series metadata
(``run, run_dir, path, seed, task`` for circuitfade runs).
"""

from __future__ import annotations

from circuitfade.compat import deprecated_names

from .hf import check_series_weights, load_hf_local
from .runs import open_run
from .series import CheckpointSeries, Snapshot
from .sources import attach, from_hf, from_models, from_run, from_state_dicts, step_from_name
from .tracing import Metric, head_label, load_trace, metric, per_head_frame, save_trace, trace

__all__ = [
    "Snapshot",
    "CheckpointSeries",
    "open_run",
    "attach",
    "from_run",
    "from_hf",
    "from_state_dicts",
    "from_models",
    "load_hf_local",
    "check_series_weights",
    "step_from_name",
    "trace",
    "save_trace",
    "load_trace",
    "Metric",
    "metric",
    "head_label",
    "per_head_frame",
]

__getattr__ = deprecated_names(__name__, {
    "NoGates": ("circuitfade.gating", "NoGatesError"),
    "NoGatesError": ("circuitfade.gating", "NoGatesError"),
    "TL39_ONLY_DEFAULTS": ("circuitfade.compat", "TL39_ONLY_DEFAULTS"),
})
"""Names of the previous release (a ``DeprecationWarning`` names the replacement). The tables of
accepted sources (``NAMING_SCHEMES``, ``WEIGHT_SUFFIXES`` in :mod:`~circuitfade.store.sources`,
``SUPPORTED_HF_ARCHITECTURES`` in :mod:`~circuitfade.store.hf`) and the trace's columns
(``TRACE_COLUMNS`` in :mod:`~circuitfade.store.tracing`) are importable from their modules."""
