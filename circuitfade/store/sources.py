"""attach(): one constructor per source kind (:func:`from_run`, :func:`from_hf`,
:func:`from_state_dicts`, :func:`from_models`) and the dispatcher over them; step
parsing and eager header validation."""

from __future__ import annotations

import dataclasses
import numbers
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from circuitfade import compat
from circuitfade.io import (
    MAX_STEP,
    SHAPE_FIELDS,
    CheckpointError,
    check_file,
    check_finite,
    check_state_dict,
    load_tensors,
    read_header,
    read_json,
)
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

from .hf import HF_WEIGHT_FILES, hf_config, hf_series
from .runs import is_run_dir, open_run
from .series import CheckpointSeries, Snapshot

WEIGHT_SUFFIXES: tuple[str, ...] = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
"""File suffixes :func:`attach` treats as state-dict checkpoints (``.ckpt``: PyTorch Lightning)."""


# --------------------------------------------------------------------------------------
# step numbers from names
# --------------------------------------------------------------------------------------
STEP_WORDS: tuple[str, ...] = ("step", "steps", "iter", "iters", "iteration", "iterations")
"""Words whose number is the step (rule 1 of :func:`step_from_name`; ``global_step`` ends in ``step``)."""

CHECKPOINT_WORDS: tuple[str, ...] = ("checkpoint", "ckpt", "model")
"""Words whose number is the step when no :data:`STEP_WORDS` number is there (rule 2)."""

EPOCH_WORDS: tuple[str, ...] = ("epoch", "epochs")
"""Words whose number is an epoch, never a step (see ``steps_per_epoch``)."""

# a number: a whole integer, a decimal (never a step: "acc0.98"), scientific ("1e-3", never a step),
# with an optional thousands suffix ("1k", "2.5k"); a "-" is a sign only after a separator or at the start
_NUMBER = re.compile(r"(?<![0-9.])(?P<neg>-)?(?P<num>\d+(?:\.\d+)?)(?P<exp>[eE][-+]?\d+)?(?P<k>[kK](?![A-Za-z]))?")
_WORD_BEFORE = re.compile(r"([A-Za-z]+)([-_= ]?)$")

NAMING_SCHEMES: tuple[tuple[str, int], ...] = (
    ("step_100.pt", 100),
    ("step100_acc0.98.pt", 100),
    ("epoch3_step100.pt", 100),
    ("epoch=3-step=300.ckpt", 300),
    ("ckpt-100.safetensors", 100),
    ("ckpt_step1200.pt", 1200),
    ("ckpt_10k.pt", 10000),
    ("model_2.5k.pt", 2500),
    ("model_100.pt", 100),
    ("model-000300.safetensors", 300),
    ("model_2L_300.pt", 300),
    ("gpt2_bf16_step40.pt", 40),
    ("iter_100.pth", 100),
    ("global_step100.bin", 100),
    ("checkpoint-100", 100),
    ("revision-2000", 2000),
    ("100.pt", 100),
)
"""File / folder names and the step :func:`step_from_name` reads from each (tested one by one)."""

STEP_HINT = ("pass steps=[...] (one step per checkpoint, in natural order of the names), "
             "step_pattern=r'...(\\d+)...' (a regex whose group is the step) or pattern='...' (a glob that "
             "leaves out files that are not checkpoints)")
"""How to label checkpoints whose names do not say their step (in error messages)."""


def _in_range(n: int, name: str) -> int:
    if n < 0:
        raise ValueError(f"negative step {n} in the name {name!r}; steps are >= 0")
    if n > MAX_STEP:
        raise ValueError(f"step {n} in the name {name!r} is beyond int64 (the largest step is {MAX_STEP})")
    return n


def _numbers(name: str) -> dict[str, list[int]]:
    """The whole numbers of ``name`` by the word before each: ``"step"`` (rule 1), ``"checkpoint"``
    (rule 2), ``"epoch"`` and ``"bare"`` (no word, or a word of its own after a separator).

    Left out: decimals and scientific numbers (``acc0.98``, ``1e-3``) and digits that belong to a
    word: glued to letters other than a step, checkpoint or epoch word (``v2``, ``bf16``, ``seed1``),
    or followed by a letter (``2L``, ``70m``). ``1k``/``2.5k`` are thousands (1000, 2500).
    """
    out: dict[str, list[int]] = {"step": [], "checkpoint": [], "epoch": [], "bare": []}
    for m in _NUMBER.finditer(name):
        start = m.start()
        before = name[:start]
        negative = m.group("neg") is not None
        glued_sep = ""
        if negative and before and not before[-1] in "_= ":
            negative, glued_sep = False, "-"  # "ckpt-100": the "-" separates, it is not a sign
        after = name[m.end():m.end() + 1]
        if after.isalpha():
            continue  # "2L", "70m": the digits belong to a word
        wm = _WORD_BEFORE.search(before)
        word, sep = (wm.group(1).lower(), glued_sep or wm.group(2)) if wm else ("", glued_sep)
        if word in STEP_WORDS:
            kind = "step"
        elif word in CHECKPOINT_WORDS:
            kind = "checkpoint"
        elif word in EPOCH_WORDS:
            kind = "epoch"
        elif word and not sep:
            continue  # "v2", "bf16", "seed1"
        else:
            kind = "bare"
        if m.group("exp"):
            continue  # "1e-3": a learning rate, never a step
        text = m.group("num")
        if m.group("k"):
            thousands = Decimal(text) * 1000
            if thousands != thousands.to_integral_value():
                raise ValueError(f"the name {name!r}: {text}{m.group('k')} is not a whole number of steps")
            value = int(thousands)
        elif "." in text:
            continue  # a decimal ("acc0.98", "loss_0.42")
        else:
            value = int(text)
        out[kind].append(-value if negative else value)
    return out


def step_from_name(name: str, step_pattern: str | re.Pattern | None = None, *,
                   steps_per_epoch: int | None = None) -> int | None:
    """The training step a checkpoint's file stem or folder name states, ``None`` if it states none.

    With ``step_pattern`` (a regex): its group named ``step``, else its only group, in the first
    match (``ValueError`` if it does not match). Otherwise, in order:

    1. the number right after ``step``/``steps``/``global_step``/``iter``/``iteration``
       (``step_100``, ``step100_acc0.98``, ``epoch3_step100``, Lightning ``epoch=3-step=300``);
    2. else the number right after ``checkpoint``/``ckpt``/``model`` (``ckpt-100``,
       Hugging Face ``checkpoint-100``, TransformerLens ``model_100``);
    3. else the only other whole number (``revision-2000``, ``100``, ``model_2L_300``).

    ``1k`` and ``2.5k`` are 1000 and 2500. Never a step: decimals (``acc0.98``), scientific
    numbers (``1e-3``) and digits that belong to a word (``2L``, ``v2``, ``bf16``, ``seed1``).
    A number after ``epoch`` is an epoch, not a step: a name that states only an epoch
    (``checkpoint_epoch_3``) is refused unless ``steps_per_epoch`` is given (then step = epoch ×
    ``steps_per_epoch``). ``ValueError`` when the rule that applies finds two different numbers
    (``step10_step20``, ``run_3_seed_1``), a negative number (``step_-5``), a number beyond
    ``int64``, or only an epoch. See :data:`NAMING_SCHEMES` for tested examples.
    """
    if step_pattern is not None:
        rx = re.compile(step_pattern) if isinstance(step_pattern, str) else step_pattern
        if "step" not in rx.groupindex and rx.groups != 1:
            raise ValueError(f"step_pattern r'{rx.pattern}': needs one group (or a group named 'step') holding the step")
        m = rx.search(name)
        if m is None:
            raise ValueError(f"step_pattern r'{rx.pattern}' does not match the name {name!r}")
        text = m.group("step") if "step" in rx.groupindex else m.group(1)
        if text is None or not re.fullmatch(r"-?\d+", text):
            raise ValueError(f"step_pattern r'{rx.pattern}': its group matched {text!r} in {name!r}, not an integer")
        return _in_range(int(text), name)
    nums = _numbers(name)
    for kind in ("step", "checkpoint"):
        found = sorted(set(nums[kind]))
        if len(found) > 1:
            raise ValueError(f"the name {name!r} states several steps {found}")
        if found:
            return _in_range(found[0], name)
    epochs, bare = sorted(set(nums["epoch"])), sorted(set(nums["bare"]))
    if len(bare) + len(epochs) > 1:
        raise ValueError(f"the name {name!r} holds several numbers {sorted(bare + epochs)} and none follows 'step', "
                         "'iter', 'checkpoint', 'ckpt' or 'model'; which one is the step is ambiguous")
    if epochs:
        if steps_per_epoch is None:
            raise ValueError(f"the name {name!r} states epoch {epochs[0]} but no step, and an epoch is not a step: "
                             "pass steps_per_epoch=N (step = epoch x N)")
        return _in_range(epochs[0] * steps_per_epoch, name)
    return _in_range(bare[0], name) if bare else None


def _check_steps(steps, what: str) -> list[int]:
    """Integer step labels in ``[0, int64 max]`` (``ValueError`` naming the bad one)."""
    out = []
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise ValueError(f"{what}: steps must be integers, got {s!r}")
        if s < 0:
            raise ValueError(f"{what}: negative step {s}; training steps are >= 0")
        if s > MAX_STEP:
            raise ValueError(f"{what}: step {s} is beyond int64 (the largest step is {MAX_STEP})")
        out.append(int(s))
    return out


def _natural_key(name: str):
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t]


def _stem(p: Path) -> str:
    return p.name[: -len(p.suffix)] if p.suffix else p.name


def _label_steps(items: list[Path], steps: Sequence[int] | None, what: str, *,
                 step_pattern: str | None = None, steps_per_epoch: int | None = None,
                 recorded: Sequence[int | None] | None = None) -> tuple[list[int], list[int]]:
    """``(kept, labels)``: the indices of ``items`` (already in natural order) that are
    checkpoints of the series, and their steps.

    ``steps`` if given (it overrides names and files; every item is kept); else per item the
    step the file records (``recorded``: a full checkpoint's ``step`` entry or safetensors
    metadata), which must agree with a step its name states after a step word; else the step
    of the name (:func:`step_from_name`, with ``step_pattern`` / ``steps_per_epoch``). A lone
    item without a number is step 0. Beside items whose names state a step, an item whose name
    states none (``model_final.pt``, ``latest.pt``) is left out with a warning naming it and the
    ``pattern=`` to pass, unless it records a step of its own that no other item has. Refusals
    (:class:`CheckpointError`) name the file and say how to label it (:data:`STEP_HINT`).
    """
    if steps is not None:
        steps = list(steps)
        if len(steps) != len(items):
            raise ValueError(
                f"steps= has {len(steps)} entries but there are {len(items)} {what}: "
                f"{[p.name for p in items][:10]}"
            )
        return list(range(len(items))), _check_steps(steps, "steps=")
    recorded = list(recorded) if recorded is not None else [None] * len(items)
    named: list[int | None] = []
    for p, rec in zip(items, recorded):
        name = p.name if p.is_dir() else _stem(p)
        try:
            s = step_from_name(name, step_pattern, steps_per_epoch=steps_per_epoch)
        except ValueError as e:
            if rec is None:
                raise CheckpointError(f"{p}: {e}; {STEP_HINT}") from None
            s = None
        if rec is not None:
            stated = s is not None and (step_pattern is not None
                                        or any(_numbers(name)[w] for w in ("step", "checkpoint")))
            if stated and s != rec:
                raise CheckpointError(f"{p}: the name says step {s} but the file records step {rec}; one of them "
                                      f"is wrong (pass steps=[...] to label the files yourself)")
        named.append(s)
    out = [rec if rec is not None else s for s, rec in zip(named, recorded)]
    if len(items) == 1 and out[0] is None:
        return [0], [0]  # a lone checkpoint without a number is step 0
    kept = list(range(len(items)))
    if any(s is not None for s in named) and any(s is None for s in named):
        skip = [i for i in kept if named[i] is None and (out[i] is None or out.count(out[i]) > 1)]
        if skip:
            names = [items[i].name for i in skip]
            warnings.warn(f"{items[0].parent}: left out {names}: their names state no step beside "
                          f"{what} whose names do (pass pattern='...', a glob, to choose the {what} yourself, "
                          "or steps=[...] to label them all)", UserWarning, stacklevel=4)
            kept = [i for i in kept if i not in skip]
    for i in kept:
        if out[i] is None:
            raise CheckpointError(f"{items[i]}: no step number in the name; {STEP_HINT}")
    labels = [out[i] for i in kept]
    dup = sorted({s for s in labels if labels.count(s) > 1})
    if dup:
        names = [items[i].name for i in kept if out[i] in dup]
        raise CheckpointError(f"{what} share step numbers {dup} ({names}); {STEP_HINT}")
    return kept, labels


def _build_config(config, source: str):
    """A ``HookedTransformerConfig`` (or ``SoftPriorConfig``; on TransformerLens 4 a
    ``TransformerBridgeConfig``) from an object, dict or JSON file."""
    if compat.is_config(config):
        return config
    if isinstance(config, (str, Path)):
        f = Path(config)
        d = read_json(f)
        if not isinstance(d, dict):
            raise CheckpointError(f"{f}: expected a JSON object with HookedTransformerConfig fields")
        if d.get("class") == "SoftPriorTransformer" and "config" in d:  # SoftPriorTransformer.save_pretrained
            return SoftPriorConfig.from_json_dict(d["config"], source=str(f))
        return _build_config(d, str(f))
    if isinstance(config, Mapping):
        d = dict(config)
        if "priors" in d and "gate_modes" in d:
            return SoftPriorConfig.from_json_dict(d, source=source)
        return compat.config_from_dict(d, source)
    raise ValueError(
        "config= must be a HookedTransformerConfig (or SoftPriorConfig), a dict of its fields, "
        f"or a path to a JSON file with them; got {type(config).__name__}"
    )


def _new_model(cfg, device: str = "cpu", *, shapes_only: bool = False) -> nn.Module:
    """An untrained model for ``cfg`` on ``device``; its weights are to be overwritten.

    Plain models (:func:`circuitfade.compat.plain_model`) skip the random init, and with
    ``shapes_only`` are built on the meta device (no memory), for header checks.
    """
    if isinstance(cfg, SoftPriorConfig):
        return SoftPriorTransformer(dataclasses.replace(cfg, device=device))
    return compat.plain_model(cfg, device, init_weights=False, meta=shapes_only)


def _native(sd: Mapping, model: nn.Module, source: str) -> dict:
    """A ``HookedTransformer``-format state dict in ``model``'s own form (see
    :func:`circuitfade.compat.native_state_dict`; unchanged on TransformerLens 3)."""
    try:
        return compat.native_state_dict(sd, model)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None


def _headers(files: list[Path], key: str | None, in_folder: bool) -> list:
    """:func:`~circuitfade.io.read_header` of every file; in a folder a refusal suggests ``pattern=``."""
    out = []
    for f in files:
        try:
            out.append(read_header(f, key=key))
        except CheckpointError as e:
            if not in_folder:
                raise
            raise CheckpointError(f"{e} (if {f.name} is not a checkpoint, leave it out with pattern='...', "
                                  "a glob matching only the checkpoints)") from None
    return out


def _module_prefix(names, top: set[str]) -> str:
    """The prefix every tensor name of a file shares that is not part of the model's own names
    (PyTorch Lightning's ``model.``, DDP's ``module.``, ``torch.compile``'s ``_orig_mod.``, or
    several of them), ``""`` if none. ``top``: the first name components of the model's tensors."""
    names, prefix = list(names), ""
    while names and all("." in n for n in names):
        first = {n.split(".", 1)[0] for n in names}
        if len(first) != 1 or next(iter(first)) in top:
            break
        p = first.pop() + "."
        prefix += p
        names = [n[len(p):] for n in names]
    return prefix


def _split_fields(cfg) -> dict[str, int]:
    """The :data:`~circuitfade.io.SHAPE_FIELDS` values of a model config."""
    return {k: getattr(cfg, k) for k in SHAPE_FIELDS if isinstance(getattr(cfg, k, None), int)}


def _hand_written(config) -> bool:
    """Whether a config came as a dict or JSON file that its config class's ``to_dict()`` did not
    write (it lacks ``n_params``, which ``to_dict()`` always writes on both TransformerLens lines)."""
    if isinstance(config, (str, Path)):
        config = read_json(config)
    return isinstance(config, Mapping) and "n_params" not in config and "priors" not in config


def _check_recorded_fields(files: list[Path], headers: list, cfg, sibling: Path | None, hand_written: bool) -> None:
    """Refuse a file (or a ``config.json`` beside the files, when ``config=`` was passed) that
    records another shape than the config. Fused q/k/v tensors (``[n_heads*d_head, d_model]``,
    what TransformerLens 4 saves) fit every head split of the same product, so when the files are
    fused, nothing records the split and the config was written by hand (a dict or JSON file
    that ``cfg.to_dict()`` did not write), warn that the split is the config's word alone."""
    have = _split_fields(cfg)
    confirmed = False
    if sibling is not None:
        other = read_json(sibling)
        if isinstance(other, Mapping):
            wrong = [f"{k}={other[k]!r} there but {k}={have[k]} in config=" for k in have
                     if k in other and other[k] != have[k]]
            if wrong:
                raise CheckpointError(f"{sibling}: {'; '.join(wrong)}; the config does not describe these weights "
                                      "(pass the config they were saved with)")
            confirmed = all(k in other for k in ("n_heads", "d_head"))
    split = True
    for f, h in zip(files, headers):
        wrong = {k: v for k, v in h.fields.items() if k in have and v != have[k]}
        if wrong:
            said = ", ".join(f"{k}={have[k]}" for k in wrong)
            raise CheckpointError(f"{f}: the file records {', '.join(f'{k}={v}' for k, v in wrong.items())} but "
                                  f"the config says {said}; the config does not describe these weights")
        confirmed = confirmed or all(k in h.fields for k in ("n_heads", "d_head"))
        split = split and any(k.endswith((".attn.W_Q", ".attn.W_K")) for k in h.tensors)
    if hand_written and not split and not confirmed and not isinstance(cfg, SoftPriorConfig):
        warnings.warn(
            f"{files[0].parent}: the attention weights are fused ([n_heads*d_head, d_model]), which fits any "
            f"head split; n_heads={have.get('n_heads')} x d_head={have.get('d_head')} is the word of a hand-written "
            "config alone (a wrong split gives wrong heads and losses): use the config the model was trained "
            "with (json.dump(cfg.to_dict(), f, default=str)), or record n_heads and d_head in the checkpoint "
            "(an entry 'config')", UserWarning, stacklevel=5)


def _file_series(files: list[Path], headers: list, steps: list[int], cfg, device, metadata, source: str,
                 key: str | None = None, sibling: Path | None = None, hand_written: bool = False) -> CheckpointSeries:
    skeleton = _new_model(cfg, shapes_only=True)
    expected = skeleton.state_dict()
    top = {k.split(".", 1)[0] for k in expected} | {"embed", "pos_embed", "blocks", "ln_final", "unembed"}
    prefixes = {}
    for f, h in zip(files, headers):  # eager, header-only validation (meta tensors: names, shapes, dtypes)
        bad = sorted(k for k, (_, d) in h.tensors.items() if not isinstance(d, torch.dtype))
        if bad:
            raise CheckpointError(f"{f}: tensors of a dtype torch cannot hold: {bad[:4]}")
        prefixes[f] = p = _module_prefix(h.tensors, top)
        peeked = {k[len(p):]: torch.empty(s, dtype=d, device="meta") for k, (s, d) in h.tensors.items()}
        _check_fit(_native(peeked, skeleton, str(f)), expected, str(f))
    _check_recorded_fields(files, headers, cfg, sibling, hand_written)

    def loader(file: Path) -> Callable[[], nn.Module]:
        def load() -> nn.Module:
            model = _new_model(cfg, device or "cpu")
            p = prefixes[file]
            sd = {k[len(p):]: v for k, v in load_tensors(file, key=key).items()}
            check_finite(sd, str(file))
            sd = _native(sd, model, str(file))
            _check_fit(sd, model.state_dict(), str(file))
            model.load_state_dict(sd, strict=True)
            return model.to(device or "cpu", print_details=False)
        return load

    snaps = [Snapshot(s, loader(f), str(f)) for f, s in zip(files, steps)]
    return CheckpointSeries(snaps, metadata, source=source)


def _check_fit(sd: Mapping, expected: Mapping, source: str) -> None:
    """:func:`~circuitfade.io.check_state_dict` with exact dtypes: a file saved in another
    floating dtype than the config's (``bfloat16`` weights, a ``float32`` config) is refused,
    never converted, so the model analysed is the one that was saved."""
    other = {k: v.dtype for k, v in sd.items() if k in expected and v.is_floating_point()
             and expected[k].is_floating_point() and v.dtype != expected[k].dtype}
    if other:
        k = next(iter(other))
        found = sorted({str(d).removeprefix("torch.") for d in other.values()})
        want = str(expected[k].dtype).removeprefix("torch.")
        raise CheckpointError(f"{source}: the weights are stored as {', '.join(found)} ({len(other)} tensors, e.g. "
                              f"{k}) but the config's dtype is {want}; they are not converted: set dtype="
                              f"{found[0]!r} in the config to analyse them as saved")
    check_state_dict(sd, expected, source, exact_dtype=True)


def _weight_files(folder: Path, pattern: str | None) -> list[Path]:
    """The checkpoint files of ``folder`` (names with a :data:`WEIGHT_SUFFIXES` suffix matching
    ``pattern``, hidden files left out), in natural order. An entry with such a name that is not
    a readable regular file (a dangling symlink, a symlink loop, a directory, an unreadable
    file) is refused, naming it, rather than silently left out."""
    files = [p for p in folder.glob(pattern or "*") if not p.name.startswith(".")
             and p.suffix.lower() in WEIGHT_SUFFIXES]
    for p in files:
        check_file(p)
    return sorted(files, key=lambda p: _natural_key(p.name))


# --------------------------------------------------------------------------------------
# one constructor per source kind; attach() dispatches to them
# --------------------------------------------------------------------------------------
_ACCEPTED = (
    "a circuitfade run directory; a local Hugging Face model directory; a folder of Hugging Face "
    "model directories (one per revision); a folder of .pt/.pth/.bin/.safetensors/.ckpt state dicts (with "
    "config=); a state-dict file or a list of them; a dict {step: file}; a model, a list/tuple of "
    "models or a dict {step: model} (HookedTransformer / SoftPriorTransformer / any nn.Module)"
)


def _is_pathlike(x) -> bool:
    return isinstance(x, (str, Path))


def _folder_meta(folder: Path, metadata: Mapping | None) -> dict:
    """Default metadata of a source on disk (``run``: folder name, ``run_dir``), overridden by ``metadata``."""
    folder = folder.resolve()
    return {"run": folder.name, "run_dir": str(folder), **dict(metadata or {})}


def _step_items(source: Mapping) -> list[tuple[int, Any]]:
    """``{step: x}`` items sorted by step; keys must be non-negative integers."""
    keys = list(source)
    bad = [k for k in keys if isinstance(k, bool) or not isinstance(k, numbers.Integral)]
    if bad:
        raise ValueError(f"a dict source needs integer step keys, got {bad[:5]!r} among {keys[:5]!r}")
    _check_steps(keys, "dict source")
    return sorted(((int(k), v) for k, v in source.items()), key=lambda kv: kv[0])


def _select(series: CheckpointSeries, steps: Sequence[int] | None) -> CheckpointSeries:
    return series.select(steps) if steps is not None else series


def from_run(run_dir: str | Path, *, steps: Sequence[int] | None = None, metadata: Mapping | None = None,
             device: str | None = None) -> CheckpointSeries:
    """A circuitfade run directory (:func:`open_run`); ``steps`` selects a subset."""
    series = open_run(run_dir, device=device)
    series.metadata.update(metadata or {})
    return _select(series, steps)


def from_models(models, *, steps: Sequence[int] | None = None, metadata: Mapping | None = None,
                device: str | None = None) -> CheckpointSeries:
    """In-memory models: one, a list/tuple (steps ``0..n-1`` unless ``steps=``) or a dict ``{step: model}``.

    Models are moved (in place, ``nn.Module.to``) only if ``device`` is given.
    """
    if isinstance(models, nn.Module):
        models = [models]
    own_steps = isinstance(models, Mapping)
    if own_steps:
        items = _step_items(models)
        labels, models = [k for k, _ in items], [m for _, m in items]
    else:
        models = list(models)
        labels = list(range(len(models))) if steps is None else _check_steps(steps, "steps=")
        if len(labels) != len(models):
            raise ValueError(f"steps= has {len(labels)} entries for {len(models)} models")
    if not models or not all(isinstance(m, nn.Module) for m in models):
        raise ValueError("from_models needs one or more nn.Module models")

    def loader(m: nn.Module) -> Callable[[], nn.Module]:
        return lambda: m.to(device) if device is not None else m

    snaps = [Snapshot(s, loader(m), f"in-memory {type(m).__name__} #{i}")
             for i, (m, s) in enumerate(zip(models, labels))]
    series = CheckpointSeries(snaps, dict(metadata or {}), source=f"{len(models)} in-memory models")
    return _select(series, steps) if own_steps else series


def from_state_dicts(files, *, config=None, steps: Sequence[int] | None = None, pattern: str | None = None,
                     step_pattern: str | None = None, steps_per_epoch: int | None = None, key: str | None = None,
                     metadata: Mapping | None = None, device: str | None = None) -> CheckpointSeries:
    """State-dict files of a ``HookedTransformer`` / ``SoftPriorTransformer``: a folder of them
    (``pattern`` filters), one file, a list of files, or a dict ``{step: file}``.

    A file holds a bare state dict, or a full training checkpoint (``{"model": sd,
    "optimizer": ..., "step": s}``, or a PyTorch Lightning ``.ckpt``) whose state dict is the
    entry ``key`` or the one of :data:`~circuitfade.io.MODEL_STATE_KEYS` present; a prefix all
    its names share (Lightning's ``model.``, DDP's ``module.``) is dropped. Steps: ``steps=`` if
    given, else the step the file records (a full checkpoint's ``step``/``global_step`` entry; it
    must agree with a step the name states), else the name's (:func:`step_from_name`, or
    ``step_pattern``; ``steps_per_epoch`` for names that state only an epoch). In a folder, files
    whose names state no step beside files whose names do (``model_final.pt``, ``latest.pt``)
    are left out with a warning naming them.

    ``config`` (default: ``config.json`` next to the files) is a
    ``HookedTransformerConfig``, a dict of its fields or a JSON file of them. Every
    file's header (names, shapes, dtypes) is checked against it now: every shape the config
    implies (the head split too, where the file holds per-head tensors or records its config),
    and the dtype exactly (a ``bfloat16`` file with a ``float32`` config is refused, not
    converted). Weights holding NaN or inf are refused when loaded, naming the file and tensor.
    """
    own_steps = isinstance(files, Mapping)
    in_folder = False
    cfg = None if config is None else _build_config(config, "config")  # a bad config is named before any file
    if own_steps:
        items = _step_items(files)
        if not items or not all(_is_pathlike(v) for _, v in items):
            raise ValueError(f"a dict source maps steps to models or to files; accepted sources: {_ACCEPTED}")
        paths, labels = [Path(v) for _, v in items], [k for k, _ in items]
        _check_files_exist(paths)
        headers = _headers(paths, key, False)
        folder = paths[0].parent
    else:
        if _is_pathlike(files) and Path(files).is_dir():
            folder, in_folder = Path(files), True
            paths = _weight_files(folder, pattern)
            if not paths:
                raise CheckpointError(f"{folder}: no state-dict files{f' matching {pattern!r}' if pattern else ''} "
                                      f"(expected {', '.join(WEIGHT_SUFFIXES)})")
        else:
            paths = [Path(files)] if _is_pathlike(files) else [Path(p) for p in files]
            if not paths:
                raise ValueError("empty list of checkpoints")
            _check_files_exist(paths)
            folder = paths[0].parent
        headers = _headers(paths, key, in_folder)
        kept, labels = _label_steps(paths, steps, "files", step_pattern=step_pattern, steps_per_epoch=steps_per_epoch,
                                    recorded=[h.step for h in headers])
        paths, headers = [paths[i] for i in kept], [headers[i] for i in kept]
    sibling, hand_written = None, _hand_written(config) if config is not None else False
    if cfg is None:
        hand_written = _hand_written(_sibling_config(folder))
        cfg = _build_config(_sibling_config(folder), "config")
    elif (folder / "config.json").is_file() and not isinstance(cfg, SoftPriorConfig):
        sibling = folder / "config.json"  # config= given: the config saved beside the files must agree with it
    source = str(folder) if in_folder else str(paths[0]) if _is_pathlike(files) else str(folder)
    series = _file_series(paths, headers, labels, cfg, device, _folder_meta(folder, metadata), source, key, sibling,
                          hand_written)
    return _select(series, steps) if own_steps else series


def from_hf(folder: str | Path, *, steps: Sequence[int] | None = None, pattern: str | None = None,
            step_pattern: str | None = None, steps_per_epoch: int | None = None, metadata: Mapping | None = None,
            device: str | None = None) -> CheckpointSeries:
    """A local Hugging Face model directory, or a folder of them (one per revision; ``pattern`` filters;
    steps from the folder names as :func:`step_from_name` reads them, or ``steps=``/``step_pattern``).

    Every revision's ``config.json`` is read now (an empty or garbled one is refused, naming
    it) and its weight files must exist; the weight files themselves are read only when a
    revision is loaded, so a truncated ``model.safetensors`` in one revision fails when that
    revision is reached, naming the file. This keeps a folder of public revisions with a
    broken one attachable, for :func:`~circuitfade.store.revisions.sound_revisions` to report
    and skip; :func:`~circuitfade.store.hf.check_series_weights` reads every revision's
    weight headers up front (``circuitfade analyze`` does)."""
    path = Path(folder)
    if hf_config(path) is not None and any((path / w).is_file() for w in HF_WEIGHT_FILES):
        dirs = [path]
    else:
        subdirs = [p for p in path.glob(pattern or "*") if p.is_dir() and not p.name.startswith(".")]
        for p in subdirs:
            if (p / "config.json").exists():
                read_json(p / "config.json")  # a revision with an empty or garbled config.json is named, not skipped
        dirs = sorted((p for p in subdirs if hf_config(p) is not None), key=lambda p: _natural_key(p.name))
        if not dirs:
            raise CheckpointError(f"{path}: no Hugging Face model directories{f' matching {pattern!r}' if pattern else ''}")
    kept, labels = _label_steps(dirs, steps, "model directories", step_pattern=step_pattern,
                                steps_per_epoch=steps_per_epoch)
    dirs = [dirs[i] for i in kept]
    return hf_series(dirs, labels, device, _folder_meta(path, metadata), str(path))


def _kind(source, pattern: str | None) -> str:
    """Which constructor a source goes to: "models", "files", "run", "hf" (or ValueError / CheckpointError)."""
    if isinstance(source, nn.Module):
        return "models"
    if isinstance(source, Mapping):
        vals = [v for _, v in _step_items(source)]
        if vals and all(isinstance(v, nn.Module) for v in vals):
            return "models"
        if vals and all(_is_pathlike(v) for v in vals):
            return "files"
        raise ValueError(f"a dict source maps steps to models or to files; accepted sources: {_ACCEPTED}")
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("empty list of checkpoints")
        if all(isinstance(m, nn.Module) for m in source):
            return "models"
        if all(_is_pathlike(p) for p in source):
            return "files"
        raise ValueError(f"a list source must hold only models or only file paths; accepted sources: {_ACCEPTED}")
    if not _is_pathlike(source):
        raise ValueError(f"cannot attach a {type(source).__name__}; accepted sources: {_ACCEPTED}")
    path = Path(source)
    if not path.exists():
        if path.is_symlink():
            check_file(path)  # says dangling symlink or symlink loop
        raise CheckpointError(f"{path}: no such file or directory (sources are local paths, never hub ids)")
    if path.is_file():
        if path.suffix.lower() not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{path}: not a checkpoint file (expected {', '.join(WEIGHT_SUFFIXES)})")
        return "files"
    if (path / "config.json").exists():
        read_json(path / "config.json")  # an empty or garbled config.json is named, not "no checkpoints found"
    if is_run_dir(path):
        return "run"
    if hf_config(path) is not None and any((path / w).is_file() for w in HF_WEIGHT_FILES):
        return "hf"
    if any(p.is_dir() and not p.name.startswith(".") and hf_config(p) is not None for p in path.glob(pattern or "*")):
        return "hf"
    if _weight_files(path, pattern):
        return "files"
    raise CheckpointError(
        f"{path}: no checkpoints found{f' matching {pattern!r}' if pattern else ''}; accepted sources: {_ACCEPTED}"
    )


_CONSTRUCTORS = {"run": from_run, "models": from_models, "files": from_state_dicts, "hf": from_hf}
_KIND_NAMES = {"run": "a circuitfade run directory", "models": "in-memory models", "hf": "Hugging Face model directories"}


def attach(
    source,
    *,
    config=None,
    steps: Sequence[int] | None = None,
    pattern: str | None = None,
    step_pattern: str | None = None,
    steps_per_epoch: int | None = None,
    key: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    device: str | None = None,
) -> CheckpointSeries:
    """A :class:`CheckpointSeries` over any kind of checkpoints (see the module docstring).

    Dispatches to one constructor per source kind: :func:`from_run`,
    :func:`from_hf`, :func:`from_state_dicts`, :func:`from_models`.

    Args:
        source: a run directory, a Hugging Face model folder or folder of them, a folder
            of state-dict files, a file, a list of files, a dict ``{step: file}``, a
            model, a list/tuple of models, or a dict ``{step: model}``.
        config: for state-dict files only: a ``HookedTransformerConfig`` (or
            ``SoftPriorConfig``), a dict of its fields, or a JSON file of them
            (``dtype`` may be a string such as ``"float32"``). Default: ``config.json``
            next to the files.
        steps: step labels, in natural-sort order of the file/folder names (for lists:
            list order); for sources that carry their own steps (run directories,
            dicts) a subset to select.
        pattern: glob pattern restricting the files / subfolders of a folder source.
        step_pattern: for files and Hugging Face folders: a regex whose group (or group
            named ``step``) is the step in each file stem / folder name, for names that
            :func:`step_from_name` does not read (see :data:`NAMING_SCHEMES`).
        steps_per_epoch: for files and Hugging Face folders whose names state only an epoch
            (``checkpoint_epoch_3.pt``): step = epoch x ``steps_per_epoch``. Without it such
            names are refused (an epoch is not a step).
        key: for ``.pt``/``.pth``/``.bin`` full training checkpoints: the entry holding
            the model's state dict (default: whichever of ``model``, ``state_dict``,
            ``model_state_dict`` the file has).
        metadata: extra metadata merged over the defaults (``run``, ``run_dir``, ...).
        device: where loaded models go (default ``"cpu"``); in-memory models are moved
            (in place, ``nn.Module.to``) only if ``device`` is given.

    Raises:
        CheckpointError: a path that does not exist, or a file that is not a checkpoint
            or does not fit the config (named in the message).
        ValueError: an unknown source kind (message lists the accepted kinds), or
            inconsistent arguments.
    """
    if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int)
                                        or steps_per_epoch < 1):
        raise ValueError(f"steps_per_epoch= must be a positive integer, got {steps_per_epoch!r}")
    kind = _kind(source, pattern)
    kw = dict(steps=steps, metadata=metadata, device=device)
    if kind == "files":
        return from_state_dicts(source, config=config, pattern=pattern, step_pattern=step_pattern,
                                steps_per_epoch=steps_per_epoch, key=key, **kw)
    for name, value in (("config", config), ("key", key)):
        if value is not None:
            raise ValueError(f"{name}= applies to state-dict files only, not to {_KIND_NAMES[kind]}")
    if kind == "hf":
        return from_hf(source, pattern=pattern, step_pattern=step_pattern, steps_per_epoch=steps_per_epoch, **kw)
    for name, value in (("step_pattern", step_pattern), ("pattern", pattern), ("steps_per_epoch", steps_per_epoch)):
        if value is not None:
            raise ValueError(f"{name}= applies to folders of files and Hugging Face folders, not to "
                             f"{_KIND_NAMES[kind]} (which carry their own steps: select some with steps=)")
    return _CONSTRUCTORS[kind](source, **kw)


def _check_files_exist(files: list[Path]) -> None:
    for f in files:
        check_file(f)
        if f.suffix.lower() not in WEIGHT_SUFFIXES:
            raise CheckpointError(f"{f}: not a checkpoint file (expected {', '.join(WEIGHT_SUFFIXES)})")


def _sibling_config(folder: Path) -> Path:
    f = folder / "config.json"
    if f.is_file():
        return f
    raise CheckpointError(
        f"{folder}: state-dict checkpoints need a model config: pass config= (HookedTransformerConfig, "
        "dict, or JSON file) or put config.json next to the files"
    )
