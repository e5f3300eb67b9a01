"""What differs between the TransformerLens lines: the soft-prior model and the trainer
need 3.x and say so in one line under 4.x; the plain-model and hub entry points pick
the installed line's classes."""

from __future__ import annotations

import pytest
import torch

from circuitfade import compat

pytestmark = pytest.mark.tl4
tl4_only = pytest.mark.skipif(not compat.is_tl4(), reason="TransformerLens 3.x installed: checks the 4.x behaviour")
tl3_only = pytest.mark.skipif(compat.is_tl4(), reason="TransformerLens 4.x installed: checks the 3.x behaviour")


def test_line_detection_agrees_with_the_installed_version():
    major = int(compat.tl_version().split(".")[0])
    assert compat.is_tl4() == (major >= 4)
    assert compat.config_class_name() == ("TransformerBridgeConfig" if major >= 4 else "HookedTransformerConfig")


@tl4_only
@pytest.mark.parametrize("use", [
    lambda m: m.SoftPriorConfig(),
    lambda m: m.SoftPriorConfig.base(),
    lambda m: m.SoftPriorTransformer.from_pretrained("some/dir"),
    lambda m: m.SoftPriorTransformer(None),
], ids=["config", "preset", "from_pretrained", "model"])
def test_soft_prior_model_raises_one_line_on_tl4(use):
    import circuitfade.model as m

    with pytest.raises(compat.TLLineError) as e:
        use(m)
    msg = str(e.value)
    assert "\n" not in msg and "TransformerLens 3" in msg and "transformer-lens>=3.9,<4" in msg
    assert not isinstance(torch.zeros(1), m.SoftPriorConfig)  # isinstance checks still work


@tl4_only
def test_trainer_and_run_configs_raise_one_line_on_tl4():
    from circuitfade.train import RunConfig, train

    with pytest.raises(compat.TLLineError, match="needs TransformerLens 3"):
        RunConfig().model_config()
    with pytest.raises(compat.TLLineError, match="needs TransformerLens 3"):
        train(RunConfig(), None)


@tl4_only
def test_soft_prior_config_dict_in_attach_raises_one_line(tmp_path):
    from circuitfade.store import attach

    (tmp_path / "ckpt_0.safetensors").write_bytes(b"")
    with pytest.raises(compat.TLLineError):
        attach(tmp_path, config={"priors": ["pos"], "gate_modes": {}})


@tl4_only
def test_attaching_a_circuitfade_run_raises_one_line_on_tl4():
    from pathlib import Path

    from circuitfade.store import attach

    run = Path(__file__).resolve().parents[2] / "assets" / "series" / "fade600to0"  # a shipped soft-prior run
    with pytest.raises(compat.TLLineError, match="needs TransformerLens 3"):
        attach(run)


@tl4_only
def test_hooked_backend_for_hub_revisions_raises_on_tl4():
    from circuitfade.store.revisions import load_revision

    with pytest.raises(compat.TLLineError, match="backend='bridge'"):
        load_revision("EleutherAI/pythia-14m", 1000, backend="hooked")  # raises before any download


@tl4_only
def test_cli_reports_the_line_error_in_one_line(capsys, tmp_path):
    from circuitfade.cli import main

    assert main(["train", "--steps", "1", "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("circuitfade train: error:") and "TransformerLens 3" in err and "\n" not in err


@tl3_only
def test_tl3_keeps_the_soft_prior_model_and_hooked_transformer():
    from transformer_lens import HookedTransformer

    from circuitfade.model import SoftPriorConfig, SoftPriorTransformer

    compat.require_tl3("anything")  # no-op on 3.x
    model = SoftPriorTransformer(SoftPriorConfig(n_layers=1))
    assert isinstance(model, HookedTransformer) and compat.is_tl_model(model)
    assert isinstance(compat.plain_model(dict(n_layers=1, d_model=8, n_ctx=4, d_head=2, n_heads=4, d_vocab=5,
                                              attn_only=True)), HookedTransformer)


def test_tl4_requirements_list_every_core_dependency_but_transformer_lens():
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
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
            # TransformerLens itself, or the 3.x-only model module (import circuitfade.model instead)
            if any(n == "transformer_lens" or n.startswith("transformer_lens.") or n == "circuitfade.model.transformer"
                   for n in names):
                yield rel, node.lineno


def _outside_the_adapter(pkg):
    return [f"{rel}:{line}" for rel, line in _tl_importers(pkg) if rel != "compat.py" and not rel.startswith("model/")]


def test_only_compat_and_the_model_import_transformer_lens(tmp_path):
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "circuitfade"
    assert _outside_the_adapter(pkg) == [], "import TransformerLens classes through circuitfade.compat, the model through circuitfade.model"
    # planted: the checker sees a lazy import inside a function of another layer
    (tmp_path / "store").mkdir()
    (tmp_path / "compat.py").write_text("import transformer_lens\n")
    (tmp_path / "store" / "x.py").write_text("def f():\n    from transformer_lens.hook_points import HookPoint\n")
    (tmp_path / "gating.py").write_text("from circuitfade.model.transformer import GATE_MODES\n")
    assert _outside_the_adapter(tmp_path) == ["gating.py:1", "store/x.py:2"]


def test_every_module_imports_on_the_installed_line():
    import importlib
    import pkgutil

    import circuitfade

    names = [m.name for m in pkgutil.walk_packages(circuitfade.__path__, "circuitfade.")]
    assert "circuitfade.store.sources" in names and "circuitfade.viz.report" in names
    skip = {"circuitfade.__main__"}  # runs the CLI
    if compat.is_tl4():
        skip.add("circuitfade.model.transformer")  # the 3.x-only model itself
    failed = {}
    for name in sorted(set(names) - skip):
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - collected and reported below
            failed[name] = f"{type(e).__name__}: {e}"
    assert not failed, failed
