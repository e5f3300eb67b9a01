"""Revision series of public models (Pythia, OLMo), log-spaced selection and integrity checks.

Public pretraining runs publish their intermediate checkpoints as Hugging Face
*revisions* (git branches) of one model repository:

* **Pythia** (EleutherAI): ``step0``, ``step1``, ``step2``, ``step4``, ..., ``step512``,
  then ``step1000``, ``step2000``, ..., ``step143000`` (154 revisions,
  :data:`PYTHIA_REVISIONS`); every step is 1024 sequences of 2048 tokens
  (:data:`PYTHIA_TOKENS_PER_STEP` = 2,097,152 tokens).
* **OLMo** (AI2): names carry the step and the tokens seen, e.g.
  ``step1000-tokens4B`` (OLMo 1B-0724-hf), ``step5000-tokens20B`` (OLMoE), or
  ``stage1-step140000-tokens1174B`` (OLMo 2); :func:`parse_revision` reads them.

:func:`log_spaced` picks ``n`` revisions nearest to log-spaced targets (the
developmental-trajectory paper screens 10 per model). :func:`hub_series` makes a
lazy :class:`~circuitfade.store.CheckpointSeries` whose snapshots call a
``loader(model_name, revision)``; the default, :func:`load_revision`, downloads
through TransformerLens and so needs network access (never used in tests: pass
your own ``loader``, or download once and :func:`~circuitfade.store.attach` the
local folders, e.g. ``pythia-1b/step1000/`` written by ``save_pretrained``).

:func:`check_integrity` flags revisions whose weights are bit-identical to an
earlier revision's (a mislabelled or re-uploaded branch) and revisions that
cannot be read, before any screen is trusted.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from torch import Tensor

from circuitfade import compat
from circuitfade.io import CheckpointError, load_tensors
from circuitfade.store import CheckpointSeries, Snapshot, attach
from circuitfade.store.sources import WEIGHT_SUFFIXES
from circuitfade.store.hf import HF_WEIGHT_FILES, hf_weight_files
from circuitfade.store.sources import step_from_name

__all__ = [
    "PYTHIA_STEPS",
    "PYTHIA_REVISIONS",
    "PYTHIA_TOKENS_PER_STEP",
    "Revision",
    "parse_revision",
    "pythia_revisions",
    "log_spaced",
    "revision_table",
    "Loader",
    "load_revision",
    "hub_series",
    "pythia_series",
    "list_hub_revisions",
    "weights_digest",
    "check_integrity",
    "INTEGRITY_COLUMNS",
    "warn_skipped",
    "sound_revisions",
]

PYTHIA_STEPS: tuple[int, ...] = (0,) + tuple(2**k for k in range(10)) + tuple(range(1000, 143_001, 1000))
"""Training steps of the 154 public Pythia checkpoints: 0, 1, 2, 4, ..., 512, 1000, 2000, ..., 143000."""

PYTHIA_REVISIONS: tuple[str, ...] = tuple(f"step{s}" for s in PYTHIA_STEPS)
"""Hugging Face revision names of the Pythia checkpoints (``"step0"`` ... ``"step143000"``)."""

PYTHIA_TOKENS_PER_STEP = 2_097_152
"""Tokens per Pythia optimizer step: 1024 sequences x 2048 tokens."""

INTEGRITY_COLUMNS: tuple[str, ...] = ("step", "source", "status", "digest")
"""Columns of :func:`check_integrity` frames."""

_UNITS = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_STEP = re.compile(r"(?:^|[-_/])step[-_]?(\d+)(?=$|[-_/])", re.IGNORECASE)
_TOKENS = re.compile(r"(?:^|[-_/])tokens[-_]?(\d+(?:\.\d+)?)([KMGBT]?)(?=$|[-_/])", re.IGNORECASE)
_STAGE = re.compile(r"(?:^|[-_/])(stage\d+)(?=$|[-_/])", re.IGNORECASE)


# --------------------------------------------------------------------------------------
# revision names
# --------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Revision:
    """One checkpoint of a public run: ``step`` (optimizer steps), its Hugging Face revision
    ``name``, the training ``tokens`` seen (``None`` when unknown) and the ``stage``
    (``"stage1"``-style prefix of OLMo 2 names, else ``None``). Ordered by step."""

    step: int
    name: str
    tokens: int | None = None
    stage: str | None = None


def parse_revision(revision: str | int | Revision, *, tokens_per_step: int | None = None) -> Revision:
    """A :class:`Revision` from a revision name, a step number, or a ``Revision``.

    Names (case-insensitive; parts separated by ``-``, ``_`` or ``/``):

    * ``"step1000"`` -> step 1000 (Pythia, and many other runs);
    * ``"step1000-tokens4B"`` -> step 1000, 4e9 tokens (OLMo; unit suffixes ``K`` 1e3,
      ``M`` 1e6, ``B``/``G`` 1e9, ``T`` 1e12, none = tokens; decimals allowed:
      ``tokens2.5B``);
    * ``"stage1-step140000-tokens1174B"`` -> also ``stage="stage1"`` (OLMo 2).

    An ``int`` ``n`` is the revision ``"step{n}"``. When the name gives no token
    count, ``tokens = step * tokens_per_step`` if ``tokens_per_step`` is given (e.g.
    :data:`PYTHIA_TOKENS_PER_STEP`), else ``None``. Raises ValueError for a name
    without a ``step<N>`` part (e.g. ``"main"``).
    """
    if isinstance(revision, Revision):
        if revision.tokens is None and tokens_per_step is not None:
            return Revision(revision.step, revision.name, revision.step * int(tokens_per_step), revision.stage)
        return revision
    if isinstance(revision, bool):
        raise ValueError(f"a revision is a name like 'step1000' or a step number, got {revision!r}")
    if isinstance(revision, (int, np.integer)):
        if revision < 0:
            raise ValueError(f"a step must be >= 0, got {revision}")
        step = int(revision)
        name, tokens, stage = f"step{step}", None, None
    elif isinstance(revision, str):
        name = revision.strip()
        m = _STEP.search(name)
        if m is None:
            raise ValueError(
                f"revision {revision!r} has no step: expected names like 'step1000' (Pythia), "
                "'step1000-tokens4B' (OLMo) or 'stage1-step140000-tokens1174B' (OLMo 2)"
            )
        step = int(m.group(1))
        t = _TOKENS.search(name)
        tokens = None if t is None else int(round(float(t.group(1)) * _UNITS[t.group(2).upper()]))
        s = _STAGE.search(name)
        stage = None if s is None else s.group(1).lower()
    else:
        raise ValueError(f"a revision is a name like 'step1000' or a step number, got {type(revision).__name__}")
    if tokens is None and tokens_per_step is not None:
        tokens = step * int(tokens_per_step)
    return Revision(step, name, tokens, stage)


def pythia_revisions() -> list[Revision]:
    """The 154 Pythia checkpoints as :class:`Revision` objects (with token counts)."""
    return [parse_revision(name, tokens_per_step=PYTHIA_TOKENS_PER_STEP) for name in PYTHIA_REVISIONS]


def _step_of(item) -> int:
    if isinstance(item, Snapshot):
        return item.step
    return parse_revision(item).step


def log_spaced(revisions: Sequence, n: int) -> list:
    """``n`` of ``revisions`` spread evenly in log-step, always with the first and last.

    ``revisions`` holds revision names (``"step1000"``, ``"step1000-tokens4B"``),
    step numbers, :class:`Revision` or :class:`~circuitfade.store.Snapshot` objects, in
    any order; their steps must be distinct and ``>= 0``. Steps are compared on the
    scale ``u = log(1 + step)`` (so step 0 is allowed). The targets are ``n`` points
    evenly spaced in ``u`` from the smallest to the largest step; the smallest and
    largest steps are always taken, and each interior target, in increasing order,
    takes the not-yet-taken revision nearest to it in ``u`` (ties: the earlier step).
    Returns ``n`` distinct items (all of them when ``n >= len(revisions)``), as given,
    sorted by step. Raises ValueError for ``n < 2`` (with at least 2 revisions),
    duplicate steps or unparseable names.
    """
    items = list(revisions)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"n must be an int, got {n!r}")
    if not items:
        raise ValueError("no revisions to choose from")
    steps = [_step_of(r) for r in items]
    dup = sorted({s for s in steps if steps.count(s) > 1})
    if dup:
        raise ValueError(f"revisions share steps {dup}; expected one revision per step")
    order = sorted(range(len(items)), key=lambda i: steps[i])
    items = [items[i] for i in order]
    steps = [steps[i] for i in order]
    if n >= len(items):
        return items
    if n < 2:
        raise ValueError(f"n must be >= 2 (the first and the last revision are always kept), got {n}")
    u = np.log1p(np.asarray(steps, dtype=float))
    targets = np.linspace(u[0], u[-1], n)
    taken = {0, len(items) - 1}
    for target in targets[1:-1]:
        free = [i for i in range(len(items)) if i not in taken]
        taken.add(min(free, key=lambda i: (abs(u[i] - target), i)))
    return [items[i] for i in sorted(taken)]


def revision_table(revisions: Iterable, *, tokens_per_step: int | None = None) -> pd.DataFrame:
    """One row per revision: ``step, revision, tokens, stage`` (sorted by step).

    Handy to join token counts onto screen tables (``screen.merge(table, on="step")``).
    """
    revs = sorted(parse_revision(r, tokens_per_step=tokens_per_step) for r in revisions)
    return pd.DataFrame({
        "step": pd.array([r.step for r in revs], dtype="int64"),
        "revision": [r.name for r in revs],
        "tokens": pd.array([r.tokens for r in revs], dtype="Int64"),
        "stage": [r.stage for r in revs],
    })


# --------------------------------------------------------------------------------------
# loading from the hub (network; thin wrappers over TransformerLens)
# --------------------------------------------------------------------------------------
Loader = Callable[[str, Revision], nn.Module]
"""``loader(model_name, revision) -> model``: builds the model of one revision."""

_TL_CHECKPOINT_FAMILIES = ("EleutherAI/pythia", "stanford-crfm/")


def load_revision(
    model_name: str,
    revision: str | int | Revision,
    *,
    backend: str = "auto",
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    process: bool = False,
) -> nn.Module:
    """One revision of a hub model as a TransformerLens model (downloads; needs network).

    * ``backend="hooked"``: a ``HookedTransformer``. For TransformerLens's checkpointed
      families (``EleutherAI/pythia*``, ``stanford-crfm/*``)
      ``HookedTransformer.from_pretrained(model_name, checkpoint_value=step, ...)``;
      for any other model TransformerLens knows (e.g. ``allenai/OLMo-1B-hf``) the
      revision is loaded with ``transformers.AutoModelForCausalLM.from_pretrained(
      model_name, revision=name)`` and converted with ``from_pretrained(model_name,
      hf_model=...)``.
    * ``backend="bridge"``: ``TransformerBridge.boot_transformers(model_name,
      revision=name)`` (TransformerLens 3's bridge, which wraps architectures the
      ``HookedTransformer`` loader lacks, such as ``allenai/OLMo-1B-0724-hf`` and
      ``allenai/OLMoE-1B-7B-0924``), then ``enable_compatibility_mode(no_processing=
      not process)`` for HookedTransformer-style hook names.
    * ``backend="auto"``: ``"hooked"`` if ``model_name`` is one of TransformerLens's
      official model names, else ``"bridge"`` (always ``"bridge"`` on TransformerLens 4,
      which has no ``HookedTransformer``; ``"hooked"`` there raises
      :class:`~circuitfade.compat.TLLineError`).

    ``process=False`` keeps the trained weights (no LayerNorm folding or centering),
    as :func:`~circuitfade.store.load_hf_local` does: attention patterns are the same
    either way, head-output spectra are not. The downloads are untested here (no
    network); the bridge in compatibility mode screens a local GPT-NeoX folder exactly
    as ``load_hf_local`` does (``tests/library/analysis/test_development.py``). To work offline, download
    once, ``save_pretrained`` each revision into ``DIR/stepN/`` and ``attach(DIR)``.
    """
    rev = parse_revision(revision)
    if backend not in ("auto", "hooked", "bridge"):
        raise ValueError(f"backend must be 'auto', 'hooked' or 'bridge', got {backend!r}")
    return compat.load_hub_model(model_name, rev.name, rev.step, backend=backend, device=device, dtype=dtype,
                                 process=process, checkpoint_families=_TL_CHECKPOINT_FAMILIES)


def hub_series(
    model_name: str,
    revisions: Iterable[str | int | Revision],
    *,
    n: int | None = None,
    loader: Loader | None = None,
    tokens_per_step: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    **load_kwargs,
) -> CheckpointSeries:
    """A lazy :class:`~circuitfade.store.CheckpointSeries` over hub revisions of ``model_name``.

    ``revisions`` are names, steps or :class:`Revision` objects; with ``n``, the
    :func:`log_spaced` selection of ``n`` of them. Snapshot ``step`` is the revision's
    step and ``source`` is ``"{model_name}@{revision name}"``; loading a snapshot calls
    ``loader(model_name, revision)`` (default :func:`load_revision` with
    ``**load_kwargs``, which needs network access; tests pass their own). Nothing is
    loaded here. Metadata: ``run`` and ``model`` = ``model_name`` plus ``metadata``.
    """
    revs = [parse_revision(r, tokens_per_step=tokens_per_step) for r in revisions]
    if n is not None:
        revs = log_spaced(revs, n)
    if loader is None:
        loader = partial(load_revision, **load_kwargs)
    elif load_kwargs:
        raise ValueError(f"load options {sorted(load_kwargs)} apply to the default loader only")
    if not callable(loader):
        raise ValueError(f"loader must be callable(model_name, revision) -> model, got {loader!r}")
    snaps = [Snapshot(r.step, partial(loader, model_name, r), f"{model_name}@{r.name}") for r in sorted(revs)]
    meta = {"run": model_name, "model": model_name, **dict(metadata or {})}
    return CheckpointSeries(snaps, meta, source=model_name)


def pythia_series(size: str = "1b", n: int | None = 10, *, deduped: bool = False, loader: Loader | None = None,
                  **load_kwargs) -> CheckpointSeries:
    """``EleutherAI/pythia-{size}[-deduped]`` over :data:`PYTHIA_REVISIONS` (``n`` log-spaced)."""
    name = f"EleutherAI/pythia-{size}{'-deduped' if deduped else ''}"
    return hub_series(name, PYTHIA_REVISIONS, n=n, loader=loader, tokens_per_step=PYTHIA_TOKENS_PER_STEP,
                      **load_kwargs)


def list_hub_revisions(model_name: str) -> list[Revision]:
    """The step revisions (branches) of a hub repository, sorted by step (needs network).

    Branches without a ``step<N>`` part (``main``) are left out.
    """
    from huggingface_hub import list_repo_refs

    out = []
    for branch in list_repo_refs(model_name).branches:
        try:
            out.append(parse_revision(branch.name))
        except ValueError:
            continue
    return sorted(out)


# --------------------------------------------------------------------------------------
# integrity
# --------------------------------------------------------------------------------------
def _update_tensor(h: "hashlib._Hash", name: str, t: Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(json.dumps([name, str(t.dtype).removeprefix("torch."), list(t.shape)]).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _digest_mapping(tensors: Mapping[str, Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        _update_tensor(h, name, tensors[name])
    return h.hexdigest()


def _digest_safetensors(files: Sequence[Path]) -> str:
    from safetensors import safe_open

    handles = []
    try:
        for f in files:
            handles.append(safe_open(str(f), framework="pt"))
        where = {}
        for f, handle in zip(files, handles):
            for k in handle.keys():
                if k in where:
                    raise CheckpointError(f"{f}: tensor {k!r} also in {where[k][0]}")
                where[k] = (f, handle)
        h = hashlib.sha256()
        for name in sorted(where):
            _update_tensor(h, name, where[name][1].get_tensor(name))
        return h.hexdigest()
    except CheckpointError:
        raise
    except Exception as e:  # SafetensorError, OSError: truncated or foreign file
        raise CheckpointError(f"{files[0]}: unreadable safetensors weights: {e}") from None
    finally:
        handles.clear()


def _weight_files_of(path: Path) -> list[Path] | None:
    """The weight files behind a snapshot source path (None if it is not a local path)."""
    if path.is_file() and path.suffix.lower() in WEIGHT_SUFFIXES:
        return [path]
    if path.is_dir() and any((path / w).exists() for w in HF_WEIGHT_FILES):
        return hf_weight_files(path)
    return None


def weights_digest(source: str | Path | nn.Module | Mapping[str, Tensor]) -> str:
    """SHA-256 over a checkpoint's tensors, in sorted name order.

    For each tensor: its name, dtype and shape (as JSON), then its raw bytes. Two
    checkpoints have the same digest iff they hold the same tensors bit for bit,
    whatever the file format or file metadata (e.g. a step number stored in the
    safetensors header). ``source``: a weights file (``.safetensors``, ``.pt``,
    ``.pth``, ``.bin``), a Hugging Face model folder (``model.safetensors``,
    ``pytorch_model.bin`` or sharded with an index), a model (its ``state_dict``) or a
    mapping of tensors. Raises :class:`~circuitfade.io.CheckpointError` if a file
    cannot be read.
    """
    if isinstance(source, nn.Module):
        return _digest_mapping(source.state_dict())
    if isinstance(source, Mapping):
        return _digest_mapping(source)
    path = Path(source)
    files = _weight_files_of(path)
    if files is None:
        raise CheckpointError(f"{path}: no weights found (expected a weights file or a Hugging Face model folder)")
    if all(f.suffix.lower() == ".safetensors" for f in files):
        return _digest_safetensors(files)
    tensors: dict[str, Tensor] = {}
    for f in files:
        tensors.update(load_tensors(f))
    return _digest_mapping(tensors)


def _snapshot_digest(snap: Snapshot, load: bool) -> str:
    """Digest of a snapshot's weights: from its files if its source is a local weights
    file or model folder, else from the loaded model; ``load`` also builds the model."""
    path = Path(snap.source)
    local = not snap.source.startswith("in-memory") and path.exists() and _weight_files_of(path) is not None
    if local and not load:
        return weights_digest(path)
    model = snap.load()
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{snap.source}: loader returned {type(model).__name__}, not a torch model")
    return weights_digest(path) if local else _digest_mapping(model.state_dict())


def _folder_entries(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) for the revision folders / weight files of a folder attach() refused
    (steps as :func:`~circuitfade.store.sources.step_from_name` reads the names; entries whose
    name gives no single step are left to the refusal already reported)."""
    entries = []
    for p in folder.iterdir():
        if p.name.startswith(".") or p.name == "config.json":
            continue
        if p.is_dir() or p.suffix.lower() in WEIGHT_SUFFIXES:
            stem = p.name if p.is_dir() else p.name[: -len(p.suffix)]
            try:
                step = step_from_name(stem)
            except ValueError:
                continue
            if step is not None:
                entries.append((step, p))
    return sorted(entries)


def check_integrity(
    series_or_folder: CheckpointSeries | str | Path,
    *,
    load: bool = False,
    progress: bool = False,
) -> pd.DataFrame:
    """Flag duplicate and unreadable revisions of a series.

    ``series_or_folder`` is a :class:`~circuitfade.store.CheckpointSeries` or anything
    :func:`~circuitfade.store.attach` takes as a path (run directory, folder of Hugging
    Face model folders, folder of state dicts). If ``attach`` refuses a folder because
    one entry is broken (a state-dict file with a bad header), each entry is attached
    on its own so that the others are still checked.

    For each snapshot, the :func:`weights_digest` of its weights: read from the files
    when its ``source`` is a local weights file or Hugging Face folder (no model is
    built), else from the loaded model's ``state_dict``. With ``load=True`` every
    snapshot is also loaded (catching configs and shapes that do not fit). Status:

    * ``"ok"``;
    * ``"duplicate_of:<step>"``: same digest as the earliest revision ``<step>`` with it;
    * ``"load_failed:<error>"``: reading (or, with ``load``, building) failed; the
      error's type and message follow the colon.

    Returns a DataFrame with :data:`INTEGRITY_COLUMNS` ``step, source, status,
    digest`` (digest ``None`` when reading failed), one row per revision, by step.
    """
    rows: list[dict] = []
    if isinstance(series_or_folder, CheckpointSeries):
        snaps = list(series_or_folder.snapshots)
    else:
        path = Path(series_or_folder)
        try:
            snaps = list(attach(path).snapshots)
        except CheckpointError as e:
            if not path.is_dir():
                return pd.DataFrame([{"step": 0, "source": str(path), "status": f"load_failed:{_err(e)}",
                                      "digest": None}], columns=list(INTEGRITY_COLUMNS))
            snaps = []
            config = path / "config.json"
            for step, entry in _folder_entries(path):
                try:
                    kw = {"config": config} if entry.is_file() and config.is_file() else {}
                    snaps.extend(attach(entry, steps=[step], **kw).snapshots)
                except (CheckpointError, ValueError) as err:
                    rows.append({"step": step, "source": str(entry), "status": f"load_failed:{_err(err)}",
                                 "digest": None})
    iterator = snaps
    if progress:
        from circuitfade.store.tracing import progress_bar

        iterator = progress_bar(snaps, desc="integrity", leave=False)
    for snap in iterator:
        try:
            digest = _snapshot_digest(snap, load)
            rows.append({"step": snap.step, "source": snap.source, "status": "ok", "digest": digest})
        except Exception as e:  # noqa: BLE001 - any failure to read a revision is reported, not raised
            rows.append({"step": snap.step, "source": snap.source, "status": f"load_failed:{_err(e)}",
                         "digest": None})
    out = pd.DataFrame(rows, columns=list(INTEGRITY_COLUMNS)).sort_values(["step", "source"], kind="stable")
    first: dict[str, int] = {}
    status = []
    for step, st, digest in zip(out["step"], out["status"], out["digest"]):
        if st == "ok" and digest in first:
            st = f"duplicate_of:{first[digest]}"
        elif st == "ok":
            first[digest] = int(step)
        status.append(st)
    out["status"] = status
    out["step"] = out["step"].astype("int64")
    return out.reset_index(drop=True)


def _err(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def warn_skipped(report: pd.DataFrame, what: str = "revisions") -> list[int]:
    """Steps whose status is not ``"ok"``; warns once, listing them, if there are any."""
    bad = report[report["status"] != "ok"]
    if len(bad):
        listing = "; ".join(f"step {s} ({src}): {st}" for s, src, st in zip(bad["step"], bad["source"], bad["status"]))
        warnings.warn(f"skipping {len(bad)} {what}: {listing}", UserWarning, stacklevel=3)
    return [int(s) for s in bad["step"]]


def sound_revisions(series: CheckpointSeries, *, load: bool = False) -> tuple[CheckpointSeries, pd.DataFrame]:
    """``(the revisions of series that pass check_integrity, the report)``.

    Duplicate and unreadable revisions (see :func:`check_integrity`) are left out, with one
    ``UserWarning`` listing them; ``ValueError`` if none is left.
    """
    report = check_integrity(series, load=load)
    bad = set(warn_skipped(report))
    keep = [s for s in series.steps if s not in bad]
    if not keep:
        raise ValueError(f"no revision of {series.source} passed the integrity check: {report.to_dict('records')}")
    return series.select(keep), report

