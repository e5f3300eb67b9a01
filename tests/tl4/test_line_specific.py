"""What differs between the TransformerLens lines: the soft-prior model is a
``HookedTransformer`` on 3.x and a native ``HookedRootModule`` on 4.x (and trains,
attaches and runs the CLI on both); the plain-model and hub entry points pick the
installed line's classes."""

from __future__ import annotations

import pytest

from circuitfade import compat
from repo_root import REPO

pytestmark = pytest.mark.tl4
tl4_only = pytest.mark.skipif(not compat.is_tl4(), reason="TransformerLens 3.x installed: checks the 4.x behaviour")


def test_line_detection_agrees_with_the_installed_version():
    major = int(compat.tl_version().split(".")[0])
    assert compat.is_tl4() == (major >= 4)
    assert compat.config_class_name() == ("TransformerBridgeConfig" if major >= 4 else "HookedTransformerConfig")


def test_soft_prior_model_is_the_lines_model():
    """3.x: a HookedTransformer subclass; 4.x: a native HookedRootModule (TransformerLens 4 has no
    HookedTransformer). Either way a TransformerLens model with the soft-prior hooks."""
    from transformer_lens import HookedRootModule

    from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

    model = SoftPriorTransformer(SoftPriorConfig(n_layers=1))
    assert isinstance(model, HookedRootModule) and compat.is_tl_model(model)
    assert type(model).__module__ == ("circuitfade.model.native" if compat.is_tl4() else "circuitfade.model.hooked")
    assert {"blocks.0.attn.hook_prior", "blocks.0.attn.hook_gate_pos", "blocks.0.attn.hook_z"} <= set(model.hook_dict)
    if not compat.is_tl4():
        from transformer_lens import HookedTransformer

        assert isinstance(model, HookedTransformer)
        assert isinstance(compat.plain_model(dict(n_layers=1, d_model=8, n_ctx=4, d_head=2, n_heads=4, d_vocab=5,
                                                  attn_only=True)), HookedTransformer)


def test_cli_trains_on_this_line(capsys, tmp_path):
    from circuitfade.cli import main
    from circuitfade.store import open_run

    assert main(["train", "--steps", "2", "--quiet", "--out", str(tmp_path / "run")]) == 0
    series = open_run(tmp_path / "run")
    assert series.steps[-1] == 2 and compat.is_tl_model(series[2])


def test_attaching_a_circuitfade_run_written_on_39_works_here():
    from pathlib import Path

    from circuitfade.analysis import evaluate
    from circuitfade.model import SoftPriorTransformer
    from circuitfade.store import attach

    run = REPO / "circuitfade" / "data" / "series" / "fade600to0"  # shipped, trained on 3.9
    series = attach(run)
    model = series[series.steps[-1]]
    assert isinstance(model, SoftPriorTransformer)
    from circuitfade.tasks import eval_set

    batch = eval_set(series.task, 128, seed=0)
    assert evaluate(model, batch, series.task)["accuracy"] > 0.5  # a trained model, read on this line
    assert evaluate(model, batch, series.task, gates="zero")["accuracy"] >= 0.0


@tl4_only
def test_hooked_backend_for_hub_revisions_raises_on_tl4():
    from circuitfade.store.revisions import load_revision

    with pytest.raises(compat.TLLineError, match="backend='bridge'"):
        load_revision("EleutherAI/pythia-14m", 1000, backend="hooked")  # raises before any download


def test_tl4_requirements_list_every_core_dependency_but_transformer_lens():
    import re
    import tomllib
    from pathlib import Path

    root = REPO
    name = lambda req: re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")  # noqa: E731
    core = {name(r) for r in tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]}
    lines = [ln.strip() for ln in (root / "requirements-tl4.txt").read_text().splitlines()]
    tl4 = {name(ln) for ln in lines if ln and not ln.startswith("#")}
    assert "transformer-lens" in core and "transformer-lens" in tl4
    assert core - tl4 == set(), f"requirements-tl4.txt lacks {sorted(core - tl4)}"
    assert next(ln for ln in lines if ln.startswith("transformer-lens")).startswith("transformer-lens>=4")


def _tl_importers(pkg):
    import ast

    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            # TransformerLens itself, or the 3.x-only model shell (import circuitfade.model instead)
            if any(n == "transformer_lens" or n.startswith("transformer_lens.") or n == "circuitfade.model.hooked"
                   for n in names):
                yield rel, node.lineno


def _outside_the_adapter(pkg):
    return [f"{rel}:{line}" for rel, line in _tl_importers(pkg) if rel != "compat.py" and not rel.startswith("model/")]


def test_only_compat_and_the_model_import_transformer_lens(tmp_path):
    from pathlib import Path

    pkg = REPO / "circuitfade"
    assert _outside_the_adapter(pkg) == [], "import TransformerLens classes through circuitfade.compat, the model through circuitfade.model"
    # planted: the checker sees a lazy import inside a function of another layer
    (tmp_path / "store").mkdir()
    (tmp_path / "compat.py").write_text("import transformer_lens\n")
    (tmp_path / "store" / "x.py").write_text("def f():\n    from transformer_lens.hook_points import HookPoint\n")
    (tmp_path / "gating.py").write_text("from circuitfade.model.hooked import SoftPriorTransformer\n")
    assert _outside_the_adapter(tmp_path) == ["gating.py:1", "store/x.py:2"]


def test_every_module_imports_on_the_installed_line():
    import importlib
    import pkgutil

    import circuitfade

    names = [m.name for m in pkgutil.walk_packages(circuitfade.__path__, "circuitfade.")]
    assert "circuitfade.store.sources" in names and "circuitfade.viz.report" in names
    skip = {"circuitfade.__main__"}  # runs the CLI
    if compat.is_tl4():
        skip.add("circuitfade.model.hooked")  # the 3.x-only shell of the model
    failed = {}
    for name in sorted(set(names) - skip):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            failed[name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


def test_a_config_written_by_this_lines_own_to_dict_reads_back():
    """What a user of either line saves (``json.dump(cfg.to_dict(), default=str)``) builds the same config."""
    import json

    fields = dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=8, d_vocab=10, attn_only=True, act_fn=None)
    cfg = compat.make_config(fields)
    d = json.loads(json.dumps(cfg.to_dict(), default=str))
    d.pop("dtype")
    again = compat.make_config({k: v for k, v in d.items() if k in compat.config_fields()
                                or k in compat.derived_config_defaults()})
    assert again.d_model == 16 and again.n_heads == 2
    derived = compat.derived_config_defaults()
    if derived:  # 4.x: a derived attribute away from its default is refused by name
        k, v = next(iter(derived.items()))
        with pytest.raises(ValueError, match=k):
            compat.make_config({**fields, k: (not v) if isinstance(v, bool) else "changed"})


def test_soft_prior_config_subclasses_the_config_class_the_lines_model_needs():
    """Why ``SoftPriorConfig``'s base class follows the line: TransformerLens 3.9's ``HookedTransformer``
    (and each component) takes its config through ``HookedTransformerConfig.unwrap``, which keeps a
    config only if it *is* a ``HookedTransformerConfig`` and otherwise rebuilds one from ``to_dict()``,
    failing on the prior fields; so the 3.x shell needs that base. 4.x has no such class:
    ``BackboneConfig`` (the same fields and defaults) stands in."""
    import dataclasses

    from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
    from circuitfade.model.backbone import BackboneConfig

    cfg = SoftPriorConfig()
    field_names = [f.name for f in dataclasses.fields(BackboneConfig)]
    assert [f.name for f in dataclasses.fields(cfg)][:len(field_names)] == field_names
    if compat.is_tl4():
        assert SoftPriorConfig.__mro__[1] is BackboneConfig
        return
    from transformer_lens import HookedTransformerConfig

    assert SoftPriorConfig.__mro__[1] is HookedTransformerConfig and compat.is_config(cfg)
    assert HookedTransformerConfig.unwrap(cfg) is cfg and SoftPriorTransformer(cfg).cfg is cfg
    # the same fields on the 4.x stand-in are not enough: unwrap rebuilds the config and trips on the priors
    alt_cls = dataclasses.make_dataclass("Alt", [("priors", tuple, dataclasses.field(default=("pos",)))],
                                         bases=(BackboneConfig,))
    with pytest.raises(TypeError, match="priors"):
        HookedTransformerConfig.unwrap(alt_cls(d_model=8, d_head=4, n_layers=1, n_ctx=4))
