"""TransformerLens 3.9 and 4.x: the one module outside :mod:`circuitfade.model` that knows
which line is installed.

TransformerLens 4 removed ``HookedTransformer``, ``HookedTransformerConfig``,
``transformer_lens.components`` and the ``loading_from_pretrained`` stack;
``TransformerBridge`` (``boot_native``, ``boot_transformers``) replaces them. What both
lines share (``HookPoint``, ``ActivationCache``, ``hook_dict``, ``run_with_cache``,
``run_with_hooks``, ``hooks()``, ``cfg.n_layers``/``n_heads``/``d_vocab``/``n_ctx``, the
``W_Q``/``W_E``/... weight views, the ``blocks.{l}.attn.hook_*`` names in compatibility
mode) is used directly by the analysis code; everything that differs is here:

* :func:`is_tl4`, :func:`tl_version`: which line is installed;
* :func:`make_config`, :func:`is_config`, :func:`config_fields`: plain-model configs
  (``HookedTransformerConfig`` on 3.x, ``TransformerBridgeConfig`` on 4.x);
* :func:`config_from_dict`, :data:`TL39_ONLY_DEFAULTS`: a saved config of either line
  translated for the installed one (what ``circuitfade.store.attach(config=...)`` reads);
* :func:`plain_model`: a plain model from a config (a ``HookedTransformer``, or a
  ``TransformerBridge.boot_native`` bridge in compatibility mode without weight
  processing, so hook names, shapes and numerics are the ``HookedTransformer`` ones);
* :func:`native_state_dict`: a ``HookedTransformer``-format state dict
  (``blocks.0.attn.W_Q`` ...) in the form ``plain_model(cfg).load_state_dict`` takes;
* :func:`model_from_hf`: a TransformerLens model of a loaded ``transformers`` model
  (local folders, offline);
* :func:`load_hub_model`: a hub model revision (needs network);
* :func:`is_tl_model`: whether an object is a TransformerLens model of either line;
* :func:`deprecated_names`: names of the previous release that still resolve, with a
  ``DeprecationWarning`` naming the replacement, for one release.

The soft-prior model itself works on both lines (:mod:`circuitfade.model`: a
``HookedTransformer`` subclass on 3.x, a native ``HookedRootModule`` with the same
parameters, hooks and numerics on 4.x); its shells are chosen in
:mod:`circuitfade.model.transformer` and :mod:`circuitfade.model.config` with
:func:`is_tl4`.

Nothing here imports TransformerLens at import time (``import circuitfade`` stays
cheap); the line is detected on first use.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import inspect
import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from circuitfade.io import CheckpointError

__all__ = [
    "TLLineError",
    "is_tl4",
    "tl_version",
    "config_class_name",
    "config_fields",
    "config_required_fields",
    "make_config",
    "config_from_dict",
    "TL39_ONLY_DEFAULTS",
    "is_config",
    "plain_model",
    "resumes_at_layer",
    "native_state_dict",
    "model_from_hf",
    "load_hub_model",
    "is_tl_model",
    "deprecated_names",
    "legacy_kv_cache_names",
]


class TLLineError(RuntimeError):
    """A feature that the installed TransformerLens line does not provide."""


# --------------------------------------------------------------------------------------
# which line
# --------------------------------------------------------------------------------------
@functools.cache
def is_tl4() -> bool:
    """True if the installed TransformerLens is 4.x or later (no ``HookedTransformer``).

    Detected by feature (3.x ships the ``transformer_lens.HookedTransformer`` module,
    4.x does not), so source checkouts with odd version strings are classified right.
    """
    return importlib.util.find_spec("transformer_lens.HookedTransformer") is None


@functools.cache
def tl_version() -> str:
    """The installed ``transformer-lens`` version string (``"unknown"`` if not recorded)."""
    try:
        return version("transformer-lens")
    except PackageNotFoundError:  # pragma: no cover - source checkouts
        return "unknown"


# --------------------------------------------------------------------------------------
# plain-model configs
# --------------------------------------------------------------------------------------
def _config_class():
    if is_tl4():
        from transformer_lens.config import TransformerBridgeConfig

        return TransformerBridgeConfig
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig


def config_class_name() -> str:
    """``"HookedTransformerConfig"`` (3.x) or ``"TransformerBridgeConfig"`` (4.x)."""
    return _config_class().__name__


def is_config(obj) -> bool:
    """Whether ``obj`` is a plain-model config object of the installed line."""
    return isinstance(obj, _config_class())


@functools.cache
def config_fields() -> frozenset[str]:
    """Names a plain-model config accepts (for rejecting unknown fields by name).

    ``TransformerBridgeConfig.from_dict`` drops unknown keys silently, so callers
    check against this set first.
    """
    cls = _config_class()
    if not is_tl4():
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    names = set()
    for c in cls.__mro__:
        try:
            sig = inspect.signature(c.__init__)
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in sig.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return frozenset(names - {"self"})


@functools.cache
def config_required_fields() -> tuple[str, ...]:
    """Fields a plain-model config cannot do without, in declaration order
    (``n_layers``, ``d_model``, ``n_ctx``, ``d_head`` on both lines)."""
    cls = _config_class()
    if not is_tl4():
        return tuple(f.name for f in dataclasses.fields(cls)
                     if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    params = inspect.signature(cls.__init__).parameters.values()
    return tuple(p.name for p in params if p.name != "self" and p.default is p.empty
                 and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


@functools.cache
def derived_config_defaults() -> dict:
    """4.x: attributes a config's own ``to_dict()`` writes that its constructor does not take
    (e.g. ``split_attention_weights``), with their values on a default config; empty on 3.x."""
    if not is_tl4():
        return {}
    cfg = _config_class()(**{name: 1 for name in config_required_fields()})
    return {k: v for k, v in cfg.to_dict().items() if k not in config_fields()}


def make_config(d: Mapping):
    """A plain-model config of the installed line from a dict of its fields.

    A dict written by the line's own ``cfg.to_dict()`` reads back: on 4.x the attributes it
    writes that the constructor does not take are dropped when at their default value, and
    refused by name otherwise. Raises ValueError naming unknown fields; the config class's own
    errors (``TypeError``/``ValueError``/``AssertionError``) propagate.
    """
    d = dict(d)
    derived = derived_config_defaults()
    moved = sorted(k for k in d if k in derived and d[k] != derived[k] and str(d[k]) != str(derived[k]))
    if moved:
        raise ValueError(f"{config_class_name()} fields {moved} are derived by the config and cannot be set "
                         f"(at their defaults they are ignored)")
    d = {k: v for k, v in d.items() if k not in derived}
    unknown = sorted(set(d) - config_fields())
    if unknown:
        raise ValueError(f"unknown {config_class_name()} fields {unknown}")
    return _config_class()(**d)


def _as_torch_dtype(v, source: str):
    """A config's ``dtype`` (a ``torch.dtype`` or its name, ``"float32"``/``"torch.float32"``: what
    ``json.dump(cfg.to_dict(), f, default=str)`` writes) as a floating ``torch.dtype``."""
    if isinstance(v, str):
        dt = getattr(torch, v.strip().removeprefix("torch."), None)
        if not isinstance(dt, torch.dtype):
            raise CheckpointError(f"{source}: field 'dtype': unknown torch dtype {v!r} (e.g. 'float32')")
        v = dt
    if isinstance(v, torch.dtype) and not v.is_floating_point:
        raise CheckpointError(f"{source}: field 'dtype': a model's weights are floating point (float32, float16, "
                              f"bfloat16, float64), got {v}")
    return v


TL39_ONLY_DEFAULTS: dict[str, Any] = {
    "clip_qkv": None, "use_logn_attn": False, "train_seq_length": None, "use_dynamic_ntk_rope": False,
    "ungroup_grouped_query_attention": False, "rotary_base_local": None, "rotary_scaling_factor": 1.0,
    "quantization_method": None, "NTK_original_ctx_len": 8192, "use_yarn_rope": False, "yarn_factor": 1.0,
    "yarn_attention_factor": 1.0, "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0,
    "yarn_original_max_position_embeddings": 4096, "yarn_truncate": True, "yarn_global_attn_only": False,
    "use_attention_sinks": False, "norm_topk_prob": False,
}
"""The 19 fields of TransformerLens 3.9's ``HookedTransformerConfig`` that 4.x's
``TransformerBridgeConfig`` does not have, with their 3.9 defaults. A saved 3.9 config
(``cfg.to_dict()``) attaches on 4.x: these fields are dropped when at their default (they
change nothing then); a non-default one is refused, naming it."""


def _same_value(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    return a == b


def _drop_foreign_defaults(d: dict, source: str, known: frozenset[str]) -> dict:
    """``d`` without the fields the installed config class lacks that sit at their TransformerLens 3.9
    default (:data:`TL39_ONLY_DEFAULTS`); :class:`CheckpointError` naming any other unknown field."""
    unknown = sorted(set(d) - known)
    if not unknown:
        return d
    cls = config_class_name()
    changed = [k for k in unknown if k in TL39_ONLY_DEFAULTS and not _same_value(d[k], TL39_ONLY_DEFAULTS[k])]
    if changed:
        vals = ", ".join(f"{k}={d[k]!r} (3.9 default {TL39_ONLY_DEFAULTS[k]!r})" for k in changed)
        raise CheckpointError(
            f"{source}: {vals}: TransformerLens 3.9 field(s) that {cls} (transformer-lens {tl_version()}) "
            "does not have, set away from their default, so this model cannot be rebuilt on this line; load it "
            "with transformer-lens 3.9"
        )
    foreign = [k for k in unknown if k not in TL39_ONLY_DEFAULTS]
    if foreign:
        raise CheckpointError(f"{source}: unknown {cls} fields {foreign}")
    return {k: v for k, v in d.items() if k in known}


_INT_FIELDS = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "d_vocab_out")


def _check_fields(d: Mapping, source: str) -> None:
    """Missing required fields and wrongly typed integer fields, named with the file."""
    missing = [k for k in (*config_required_fields(), "d_vocab") if k not in d]
    if missing:
        raise CheckpointError(f"{source}: missing field(s) {missing} ({config_class_name()} needs them)")
    for k in _INT_FIELDS:
        v = d.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise CheckpointError(f"{source}: field {k!r} must be an integer, got {v!r}")


def config_from_dict(d: Mapping, source: str = "config"):
    """A plain-model config of the installed line from a saved or hand-written dict of its fields
    (``source`` names it in errors): a TransformerLens 3.9 ``cfg.to_dict()`` reads on 4.x (the
    fields of :data:`TL39_ONLY_DEFAULTS` dropped at their defaults), ``dtype`` may be a string
    (``"float32"``, ``"torch.float32"``). Raises :class:`~circuitfade.io.CheckpointError` naming a
    missing, unknown, wrongly typed or invalid field."""
    d = _drop_foreign_defaults(dict(d), source, config_fields() | set(derived_config_defaults()))
    _check_fields(d, source)
    if "dtype" in d:
        d["dtype"] = _as_torch_dtype(d["dtype"], source)
    try:
        return make_config(d)
    except (TypeError, ValueError, AssertionError) as e:
        raise CheckpointError(f"{source}: invalid {config_class_name()}: {e}") from None


def _as_plain_config(config):
    if isinstance(config, Mapping):
        return make_config(config)
    if not is_config(config):
        raise ValueError(f"expected a {config_class_name()} or a dict of its fields, got {type(config).__name__}")
    return config


# --------------------------------------------------------------------------------------
# plain models
# --------------------------------------------------------------------------------------
def plain_model(config, device: str = "cpu", *, init_weights: bool = True, meta: bool = False,
                tokenizer=None) -> nn.Module:
    """A plain TransformerLens model for ``config`` (a config object or a dict of its fields).

    3.x: ``HookedTransformer(cfg)``. 4.x: ``TransformerBridge.boot_native(cfg)`` with
    ``enable_compatibility_mode(no_processing=True)``: ``HookedTransformer`` hook
    names and shapes, weights as given (no folding). ``init_weights=False`` skips the
    random init (the weights are about to be overwritten); ``meta=True`` builds on
    the meta device (shapes only, no memory). Parameters have ``cfg.dtype`` on both lines.
    ``tokenizer`` (a Hugging Face tokenizer, optional) is given to the model's constructor
    (``to_tokens``/``to_string`` then work; a missing pad token becomes the EOS token).
    """
    cfg = _as_plain_config(config)
    if is_tl4():  # TransformerBridgeConfig has a hand-written __init__: replace() would drop fields
        cfg = copy.deepcopy(cfg)
        cfg.init_weights, cfg.device = init_weights, device
    else:
        cfg = dataclasses.replace(cfg, init_weights=init_weights, device=device)
    where = torch.device("meta") if meta else contextlib.nullcontext()
    if is_tl4():
        from transformer_lens import TransformerBridge

        with where:  # boot_native builds in float32 unless told the dtype (cfg.dtype alone is ignored)
            bridge = TransformerBridge.boot_native(cfg, tokenizer=tokenizer, dtype=cfg.dtype)
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
        return bridge
    from transformer_lens import HookedTransformer

    with where:
        return HookedTransformer(cfg, tokenizer, move_to_device=False)


def native_state_dict(state_dict: Mapping[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict`` in the form ``model.load_state_dict`` takes.

    3.x: unchanged. 4.x, for a ``boot_native`` bridge and a ``HookedTransformer``-format
    state dict (``embed.W_E``, ``blocks.0.attn.W_Q`` ``[head, d_model, d_head]``, ...):
    TransformerLens's ``convert_tl_checkpoint`` (per-head shapes checked against the
    config; ``mask``/``IGNORE`` and the rotary ``rotary_sin``/``rotary_cos`` buffers dropped;
    rotary query/key features reordered from GPT-NeoX to adjacent pairs). A dict already in bridge form passes
    unchanged. Works on meta tensors (header checks). Raises ValueError for a tensor
    that does not fit the config.
    """
    sd = dict(state_dict)
    if not is_tl4() or not any(".W_" in k or k.endswith((".w", ".b")) or ".b_" in k for k in sd):
        return sd
    from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint

    # rotary tables are buffers on HookedTransformer; the bridge recomputes them from the config
    sd = {k: v for k, v in sd.items() if not k.endswith((".rotary_sin", ".rotary_cos"))}
    cfg = model.cfg
    if getattr(cfg, "positional_embedding_type", None) == "rotary" and not getattr(cfg, "rotary_adjacent_pairs", False):
        sd = _neox_to_adjacent_pairs(sd, cfg)
    return convert_tl_checkpoint(sd, cfg)


def _neox_to_adjacent_pairs(sd: dict[str, torch.Tensor], cfg) -> dict[str, torch.Tensor]:
    """Reorder the query/key features of a ``HookedTransformer`` rotary checkpoint (GPT-NeoX
    pairing: feature ``i`` rotates with ``i + r/2``) for the bridge's native rotary (adjacent
    pairs ``2i, 2i+1``): new feature ``2i`` = old ``i``, ``2i+1`` = old ``i + r/2`` for
    ``i < r/2`` (``r = rotary_dim``), the rest unchanged. ``q·k`` is unchanged by a shared
    reordering, so the attention scores are those of the checkpoint."""
    d_head = cfg.d_head
    r = getattr(cfg, "rotary_dim", None) or d_head
    half = r // 2
    perm = [j for i in range(half) for j in (i, i + half)] + list(range(r, d_head))
    index = torch.tensor(perm)
    out = {}
    for k, v in sd.items():
        if k.endswith((".attn.W_Q", ".attn.W_K", ".attn.b_Q", ".attn.b_K")) and v.shape[-1] == d_head:
            v = v.index_select(-1, index.to(v.device))
        out[k] = v
    return out


def is_tl_model(obj) -> bool:
    """Whether ``obj`` is a TransformerLens model of the installed line
    (a ``HookedRootModule`` such as ``HookedTransformer`` on 3.x, a ``TransformerBridge``
    on 4.x)."""
    from transformer_lens import HookedRootModule

    if isinstance(obj, HookedRootModule):
        return True
    from transformer_lens.model_bridge import TransformerBridge

    return isinstance(obj, TransformerBridge)


def resumes_at_layer(model) -> bool:
    """Whether ``model`` is a ``HookedTransformer`` (3.x) whose forward from a block's residual
    stream (``start_at_layer`` with ``tokens``) is exactly how a whole forward goes on from that
    block: no shortformer positions (they would have to be passed again) and no left padding
    (whose attention mask a resumed forward does not rebuild). ``False`` on 4.x (a
    ``TransformerBridge``) and for anything else."""
    if is_tl4():
        return False
    from transformer_lens import HookedTransformer

    tokenizer = getattr(model, "tokenizer", None)
    return (isinstance(model, HookedTransformer) and model.cfg.positional_embedding_type != "shortformer"
            and (tokenizer is None or getattr(tokenizer, "padding_side", "right") != "left"))


# --------------------------------------------------------------------------------------
# Hugging Face models
# --------------------------------------------------------------------------------------
def model_from_hf(load_hf: Callable[[], nn.Module], model_dir: Path, config: Mapping, arch: str, *, device: str,
                  dtype: torch.dtype, process: bool, tokenizer=None) -> nn.Module:
    """A TransformerLens model of the ``transformers`` model ``load_hf()`` (read from the
    local folder ``model_dir`` whose parsed ``config.json`` is ``config``), offline.
    ``load_hf`` is called once; on 3.x the HF model is dropped before the TransformerLens
    model is built, so at most two copies of the weights are alive at once.

    3.x: TransformerLens's config conversion run on a copy of ``config.json`` in a
    neutral temporary folder (TL picks some architectures by substrings of the *name*,
    such as "llama", so the real path is never shown to it), its weight converter, and
    ``HookedTransformer.load_and_process_state_dict``. 4.x:
    ``TransformerBridge.boot_transformers(model_dir, hf_model=hf)`` (the architecture
    comes from ``hf.config``; nothing is downloaded) and
    ``enable_compatibility_mode(no_processing=not process)``. Either way ``process=False``
    keeps the trained weights (logits equal the HF model's) and ``process=True`` applies
    ``fold_ln``, ``center_writing_weights``, ``center_unembed``, ``fold_value_biases``.
    Raises :class:`~circuitfade.io.CheckpointError` if TransformerLens reads another
    architecture than ``arch``.
    """
    hf = load_hf()
    if is_tl4():
        from transformer_lens import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(model_dir), hf_model=hf, device=device, dtype=dtype,
                                                     tokenizer=tokenizer)
        if tokenizer is None:
            bridge.tokenizer = None  # as on 3.x: token ids only unless the folder has a tokenizer
        bridge.cfg.model_name = model_dir.name
        bridge.enable_compatibility_mode(no_processing=not process, disable_warnings=True)
        return bridge.eval()
    from transformer_lens import HookedTransformer
    from transformer_lens import loading_from_pretrained as tl_loading

    tmp = Path(tempfile.mkdtemp(prefix="circuitfade_hf_"))
    try:
        neutral = tmp / "model"
        neutral.mkdir()
        neutral_cfg = dict(config)
        if arch == "GPT2LMHeadModel" and "n_ctx" not in neutral_cfg:
            # transformers >= 5 no longer writes GPT-2's n_ctx; TL reads it (== n_positions)
            neutral_cfg["n_ctx"] = neutral_cfg.get("n_positions", 1024)
        (neutral / "config.json").write_text(json.dumps(neutral_cfg))
        cfg = tl_loading.get_pretrained_model_config(
            str(neutral), hf_cfg=hf.config.to_dict(), fold_ln=process, device=device, dtype=dtype,
            local_files_only=True,
        )
        if cfg.original_architecture != arch:
            raise CheckpointError(
                f"{model_dir}: TransformerLens read architecture {cfg.original_architecture!r}, config says {arch!r}"
            )
        cfg.model_name = model_dir.name
        cfg.tokenizer_name = None
        with torch.no_grad():
            sd = tl_loading.get_pretrained_state_dict(str(neutral), cfg, hf, dtype=dtype)
            sd = {k: v.detach().clone() for k, v in sd.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    del hf
    model = HookedTransformer(cfg, tokenizer, move_to_device=True)
    model.load_and_process_state_dict(
        sd, fold_ln=process, center_writing_weights=process, center_unembed=process, fold_value_biases=process,
    )
    return model.eval()


def load_hub_model(model_name: str, revision: str, step: int | None, *, backend: str, device: str,
                   dtype: torch.dtype, process: bool, checkpoint_families: tuple[str, ...] = ()) -> nn.Module:
    """One revision of a hub model (downloads; see ``circuitfade.store.load_revision``).

    ``backend``: ``"hooked"`` (3.x only), ``"bridge"`` or ``"auto"`` (``"hooked"`` for
    TransformerLens 3's official model names, else ``"bridge"``; always ``"bridge"``
    on 4.x).
    """
    if backend == "auto":
        if is_tl4():
            backend = "bridge"
        else:
            from transformer_lens.loading_from_pretrained import OFFICIAL_MODEL_NAMES

            backend = "hooked" if model_name in OFFICIAL_MODEL_NAMES else "bridge"
    if backend == "hooked":
        if is_tl4():
            raise TLLineError(
                f"backend='hooked' needs TransformerLens 3.x (installed: {tl_version()}); use backend='bridge'"
            )
        from transformer_lens import HookedTransformer

        flags = dict(fold_ln=process, center_writing_weights=process, center_unembed=process,
                     fold_value_biases=process)
        if model_name.startswith(checkpoint_families):
            return HookedTransformer.from_pretrained(
                model_name, checkpoint_value=step, device=device, dtype=dtype, **flags
            ).eval()
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_name, revision=revision, dtype=dtype)
        return HookedTransformer.from_pretrained(model_name, hf_model=hf, device=device, dtype=dtype, **flags).eval()
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(model_name, revision=revision, device=device, dtype=dtype)
    bridge.enable_compatibility_mode(disable_warnings=True, no_processing=not process)
    return bridge.eval()


# --------------------------------------------------------------------------------------
# names of the previous release
# --------------------------------------------------------------------------------------
def deprecated_names(module: str, moved: Mapping[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves ``module``'s names of the previous release.

    ``moved[old] = (home, new)``: ``module.old`` (and ``from module import old``) warns with a
    ``DeprecationWarning`` naming ``home.new`` and returns that object. ``(home, new, instead)``:
    returns ``home.new`` (the object the old name was, still importable from its module) and the
    warning names ``instead``, the public name to use. The old names are in no ``__all__`` and
    will be removed in the next release. Any other missing name raises
    ``AttributeError`` as usual (so ``from package import submodule`` still imports it)::

        __getattr__ = deprecated_names(__name__, {"successor_value_mass": ("circuitfade.analysis", "successor_mass")})
    """
    def __getattr__(name: str, stacklevel: int = 2) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, new, *instead = moved[name]
        import warnings

        use = instead[0] if instead else f"{home}.{new}"
        warnings.warn(f"{module}.{name} is deprecated and will be removed in the next release; use {use}",
                      DeprecationWarning, stacklevel=stacklevel)
        return getattr(importlib.import_module(home), new)

    __getattr__.moved = dict(moved)
    return __getattr__


@contextlib.contextmanager
def legacy_kv_cache_names():
    """Inside the block, TransformerLens 3.9's KV cache is importable under its earlier 3.x names
    (``transformer_lens.HookedTransformerKeyValueCache`` and the module
    ``transformer_lens.past_key_value_caching``), for a peer library that imports them (auto-circuit
    1.0.1, :mod:`circuitfade.analysis.peers`); both names are removed again on exit. Nothing is
    added where they exist or where the installed line has no such cache."""
    import sys
    import types

    import transformer_lens as tl

    new = getattr(tl, "TransformerLensKeyValueCache", None)
    old = "transformer_lens.past_key_value_caching"
    added_attr = new is not None and not hasattr(tl, "HookedTransformerKeyValueCache")
    added_module = new is not None and old not in sys.modules and importlib.util.find_spec(old) is None
    if added_attr:
        tl.HookedTransformerKeyValueCache = new
    if added_module:
        shim = types.ModuleType(old)
        shim.HookedTransformerKeyValueCache = new
        sys.modules[old] = shim
    try:
        yield
    finally:
        if added_attr:
            del tl.HookedTransformerKeyValueCache
        if added_module:
            sys.modules.pop(old, None)
