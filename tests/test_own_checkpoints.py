"""Your own checkpoints, read right: step numbers from the common naming schemes, full training
checkpoints, TransformerLens 3.9 configs, a Batch as the task, traces that survive a file,
static figures. Every case is planted in a temporary folder with a known answer."""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from circuitfade.compat import make_config, plain_model

from circuitfade import compat
from circuitfade.analysis import consolidation_timeline, head_diagnostics
from circuitfade.io import MODEL_STATE_KEYS, CheckpointError, read_header
from circuitfade.store import (
    NAMING_SCHEMES,
    TL39_ONLY_DEFAULTS,
    attach,
    load_trace,
    progress_bar,
    save_trace,
    step_from_name,
    trace,
)
from circuitfade.tasks import eval_set
from circuitfade.viz import plots
from circuitfade.viz.report import analyze_main
from circuitfade.viz.tables import markdown_table
from planted import CopyTask

torch.set_num_threads(1)


def tiny_cfg(**kw):
    """A one-layer attention-only model that fits the default associative-recall task (vocabulary 32)."""
    base = dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=32, attn_only=True, act_fn=None, seed=0)
    base.update(kw)
    return make_config(base)


def tiny_model(seed: int, cfg=None):
    torch.manual_seed(seed)
    m = plain_model(cfg or tiny_cfg())
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m.eval()


def config_dict(cfg) -> dict:
    """What a user saves: ``json.dump(cfg.to_dict(), f, default=str)`` (dtype as a string)."""
    return json.loads(json.dumps(cfg.to_dict(), default=str))


def plant(folder: Path, names: list[str], *, cfg=None, full: dict | None = None) -> dict:
    """Save one model per name (a state dict, or ``{**full, "model": sd}``) and config.json beside them."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = cfg or tiny_cfg()
    (folder / "config.json").write_text(json.dumps(config_dict(cfg)))
    models = {}
    for i, name in enumerate(names):
        m = tiny_model(i, cfg)
        sd = m.state_dict()
        obj = sd if full is None else {**full, "model": sd}
        if name.endswith(".safetensors"):
            from safetensors.torch import save_file
            save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / name))
        else:
            torch.save(obj, folder / name)
        models[name] = m
    return models


def same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --------------------------------------------------------------------------------------
# 1. step numbers: the common naming schemes
# --------------------------------------------------------------------------------------
SCHEMES = [  # (file names for steps 0, 100, 400) -> those steps, whatever else the names hold
    ["step0_acc0.10.pt", "step100_acc0.98.pt", "step400_acc0.99.pt"],  # the last integer would be 10, 98, 99
    ["step_0.pt", "step_100.pt", "step_400.pt"],
    ["epoch0_step0.pt", "epoch1_step100.pt", "epoch3_step400.pt"],
    ["ckpt-0.pt", "ckpt-100.pt", "ckpt-400.pt"],
    ["model_0.pt", "model_100.pt", "model_400.pt"],  # TransformerLens's own train() writes these
    ["ckpt_step0_v2.pt", "ckpt_step100_v2.pt", "ckpt_step400_v2.pt"],
    ["iter_0_loss1.5.pth", "iter_100_loss0.9.pth", "iter_400_loss0.2.pth"],
    ["global_step0.bin", "global_step100.bin", "global_step400.bin"],
    ["model-000000.safetensors", "model-000100.safetensors", "model-000400.safetensors"],
    ["0.pt", "100.pt", "400.pt"],
]


@pytest.mark.parametrize("names", SCHEMES, ids=[n[1] for n in SCHEMES])
def test_naming_schemes_give_the_step_after_the_step_word(tmp_path, names):
    models = plant(tmp_path / "ckpts", names)
    series = attach(tmp_path / "ckpts")
    assert series.steps == [0, 100, 400]
    assert same(series[100], models[names[1]])


def test_the_documented_table_is_what_step_from_name_reads():
    for name, step in NAMING_SCHEMES:
        stem = name.rsplit(".", 1)[0] if "." in name and not name.startswith("checkpoint") else name
        assert step_from_name(stem) == step, name
    assert step_from_name("checkpoint-100") == 100 and step_from_name("notes") is None


@pytest.mark.parametrize("name", ["run3_seed1", "step10_step20", "ckpt3_model4", "lr0.5_bs32_e3"])
def test_ambiguous_names_are_refused(name):
    with pytest.raises(ValueError, match="several"):
        step_from_name(name)


def test_ambiguous_folder_is_refused_with_steps_and_step_pattern_advice(tmp_path):
    folder = tmp_path / "ckpts"
    plant(folder, ["run1_seed0.pt", "run1_seed1.pt"])
    with pytest.raises(CheckpointError, match=r"run1_seed0\.pt.*steps=\[\.\.\.\].*step_pattern="):
        attach(folder)
    assert attach(folder, step_pattern=r"seed(\d+)").steps == [0, 1]
    assert attach(folder, step_pattern=r"seed(?P<step>\d+)").steps == [0, 1]
    assert attach(folder, steps=[10, 20]).steps == [10, 20]
    with pytest.raises(CheckpointError, match=r"step_pattern r'epoch\(\\d\+\)' does not match"):
        attach(folder, step_pattern=r"epoch(\d+)")


def test_hugging_face_checkpoint_folders(tmp_path):
    transformers = pytest.importorskip("transformers")
    c = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=32)
    for step in (500, 1000):
        torch.manual_seed(step)
        transformers.GPT2LMHeadModel(c).save_pretrained(tmp_path / "out" / f"checkpoint-{step}")
    (tmp_path / "out" / "runs").mkdir()  # a Trainer's log folder beside them: not a revision
    assert attach(tmp_path / "out").steps == [500, 1000]


# --------------------------------------------------------------------------------------
# 2. full training checkpoints
# --------------------------------------------------------------------------------------
def _optimizer_state(model) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    return opt.state_dict()


@pytest.mark.parametrize("key", MODEL_STATE_KEYS)
def test_full_checkpoints_with_the_common_keys_and_the_step_inside(tmp_path, key):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_dict(tiny_cfg())))
    models = {}
    for name, step in (("last.pt", 300), ("first.pt", 100)):  # names without numbers: the file says its step
        m = tiny_model(step)
        torch.save({key: m.state_dict(), "optimizer": _optimizer_state(tiny_model(0)), "step": step,
                    "args": {"lr": 1e-3, "name": "run"}}, folder / name)
        models[step] = m
    series = attach(folder)
    assert series.steps == [100, 300]
    assert same(series[100], models[100]) and same(series[300], models[300])
    assert read_header(folder / "first.pt").key == key


def test_key_names_any_other_entry_and_refusals_list_the_entries(tmp_path):
    m = tiny_model(1)
    f = tmp_path / "ckpt_step_200.pt"
    torch.save({"ema_weights": m.state_dict(), "opt": {"lr": 0.1}, "global_step": 200}, f)
    (tmp_path / "config.json").write_text(json.dumps(config_dict(tiny_cfg())))
    with pytest.raises(CheckpointError, match=r"ckpt_step_200\.pt: .*entries found: \['ema_weights', 'opt', "
                                              r"'global_step'\].*key="):
        attach(f)
    series = attach(f, key="ema_weights")
    assert series.steps == [200] and same(series[200], m)
    with pytest.raises(CheckpointError, match="no entry 'weights'"):
        attach(f, key="weights")


def test_a_name_and_a_recorded_step_that_disagree_are_refused(tmp_path):
    plant(tmp_path / "c", ["step_100.pt"], full={"step": 200, "optimizer": {}})
    with pytest.raises(CheckpointError, match=r"step_100\.pt: the name says step 100 but the file records step 200"):
        attach(tmp_path / "c")
    assert attach(tmp_path / "c", steps=[7]).steps == [7]  # steps= is the user's word


# --------------------------------------------------------------------------------------
# 3. TransformerLens 3.9 configs on 4.x
# --------------------------------------------------------------------------------------
@pytest.mark.skipif(compat.is_tl4(), reason="writes a TransformerLens 3.9 cfg.to_dict(); on 4.x the same file is "
                    "read from the 3.9 fixture in tests/tl4/test_tl39_config.py")
def test_a_json_dumped_tl39_config_attaches(tmp_path):
    cfg = tiny_cfg(dtype=torch.float32)
    plant(tmp_path / "c", ["step_1.pt"], cfg=cfg)
    d = json.loads((tmp_path / "c" / "config.json").read_text())
    assert d["dtype"] == "torch.float32" and set(TL39_ONLY_DEFAULTS) <= set(d)
    assert attach(tmp_path / "c").steps == [1]


def _as_tl4_fields(monkeypatch):
    """The installed config class without the 19 fields TransformerLens 4.x dropped (TL39_ONLY_DEFAULTS)."""
    fields = compat.config_fields() - set(TL39_ONLY_DEFAULTS)
    monkeypatch.setattr(compat, "config_fields", lambda: fields)


def test_tl39_only_fields_at_their_defaults_are_dropped_on_a_line_without_them(tmp_path, monkeypatch):
    models = plant(tmp_path / "c", ["step_1.pt", "step_2.pt"])
    _as_tl4_fields(monkeypatch)
    series = attach(tmp_path / "c")
    assert series.steps == [1, 2] and same(series[2], models["step_2.pt"])


def test_a_tl39_only_field_away_from_its_default_is_refused_by_name(tmp_path, monkeypatch):
    plant(tmp_path / "c", ["step_1.pt"])
    d = json.loads((tmp_path / "c" / "config.json").read_text())
    d["use_yarn_rope"] = True
    (tmp_path / "c" / "config.json").write_text(json.dumps(d))
    _as_tl4_fields(monkeypatch)
    with pytest.raises(CheckpointError, match=r"config\.json: use_yarn_rope=True \(3\.9 default False\)"):
        attach(tmp_path / "c")
    d["use_yarn_rope"], d["not_a_field"] = False, 1
    (tmp_path / "c" / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=r"unknown \w+ fields \['not_a_field'\]"):
        attach(tmp_path / "c")


def test_a_config_with_an_integer_dtype_is_refused(tmp_path):
    plant(tmp_path / "c", ["step_1.pt"])
    d = json.loads((tmp_path / "c" / "config.json").read_text())
    d["dtype"] = "int8"
    (tmp_path / "c" / "config.json").write_text(json.dumps(d))
    with pytest.raises(CheckpointError, match=r"config\.json: field 'dtype': .*floating point.*torch\.int8"):
        attach(tmp_path / "c")


# --------------------------------------------------------------------------------------
# 5. errors that point the right way
# --------------------------------------------------------------------------------------
def test_trace_with_only_a_batch_uses_it_as_the_task():
    models = [tiny_model(0, tiny_cfg(d_vocab=8, n_ctx=8)), tiny_model(1, tiny_cfg(d_vocab=8, n_ctx=8))]
    batch = eval_set(CopyTask(0), 16, seed=1)
    got = trace(attach(models), [head_diagnostics], batch=batch, progress=False)
    ref = trace(attach(models), [head_diagnostics], batch, progress=False)
    assert len(got) == 2 * 3 * 2 and got["value"].notna().all()
    pd.testing.assert_frame_equal(got.drop(columns="boot"), ref.drop(columns="boot"))


def test_an_extra_file_is_named_with_pattern_advice(tmp_path):
    folder = tmp_path / "c"
    models = plant(folder, ["step_0.pt", "step_50.pt"])
    torch.save({"n_layers": 1, "d_model": 16, "lr": 1e-3}, folder / "cfg.pt")  # a config saved beside them
    with pytest.raises(CheckpointError, match=r"cfg\.pt: .*entries found.*pattern="):
        attach(folder)
    series = attach(folder, pattern="step_*.pt")
    assert series.steps == [0, 50] and same(series[50], models["step_50.pt"])


def test_analyze_takes_pattern_and_steps(tmp_path, capsys):
    folder = tmp_path / "c"
    plant(folder, ["first.pt", "second.pt"])
    torch.save({"lr": 1e-3}, folder / "cfg.pt")
    out = tmp_path / "r" / "a.html"
    assert analyze_main([str(folder), "--task", "assoc", "--n", "8", "--quiet", "--out", str(out)]) == 2
    assert "cfg.pt" in capsys.readouterr().err
    assert analyze_main([str(folder), "--task", "assoc", "--n", "8", "--quiet", "--out", str(out),
                         "--pattern", "*s*.pt", "--steps", "0,100"]) == 0
    printed = capsys.readouterr().out
    assert "2 checkpoints (steps 0..100)" in printed and out.is_file()


def test_analyze_steps_is_a_checked_integer_list(capsys):
    with pytest.raises(SystemExit) as e:
        analyze_main(["anything", "--steps", "0,x"])
    assert e.value.code == 2 and "comma-separated integer steps" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# 6. traces survive a file
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def traced() -> pd.DataFrame:
    cfg = tiny_cfg(d_vocab=8, n_ctx=8)
    series = attach({0: tiny_model(0, cfg), 10: tiny_model(1, cfg), 20: tiny_model(2, cfg)},
                    metadata={"run": "r", "seed": 3})
    return trace(series, [head_diagnostics], CopyTask(0), n=16, progress=False)


def _timeline(df):
    return consolidation_timeline(df, {"successor_mass": 0.2, "ablation_importance": 0.0})


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_save_and_load_trace_round_trip_every_column(tmp_path, traced, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    f = save_trace(traced, tmp_path / f"trace{suffix}")
    back = load_trace(f)
    assert list(back.columns) == list(traced.columns)
    assert back.dtypes.to_dict() == traced.dtypes.to_dict()
    pd.testing.assert_frame_equal(back.drop(columns="boot"), traced.drop(columns="boot"))
    assert all(isinstance(b, np.ndarray) and b.dtype == a.dtype and np.array_equal(a, b, equal_nan=True)
               for a, b in zip(traced["boot"], back["boot"]))
    pd.testing.assert_frame_equal(_timeline(back), _timeline(traced))
    assert _timeline(back)["successor_mass_first_step_lo"].notna().all()  # the intervals survived


def test_a_plain_csv_round_trip_is_refused_not_read_as_nan_intervals(tmp_path, traced):
    traced.to_csv(tmp_path / "t.csv", index=False)
    plain = pd.read_csv(tmp_path / "t.csv")
    with pytest.raises(ValueError, match=r"'boot' column holds text.*save_trace / load_trace"):
        _timeline(plain)
    with pytest.raises(ValueError, match=r"t\.csv: no t\.csv\.json beside it"):
        load_trace(tmp_path / "t.csv")


def test_load_trace_refuses_a_csv_that_does_not_match_its_schema(tmp_path, traced):
    f = save_trace(traced, tmp_path / "t.csv")
    f.write_text("\n".join(f.read_text().splitlines()[:-3]) + "\n")  # rows lost
    with pytest.raises(ValueError, match=r"t\.csv: columns or row count differ from t\.csv\.json"):
        load_trace(f)


# --------------------------------------------------------------------------------------
# 8. figures: a slider heatmap exported as small multiples; the timeline printed transposed
# --------------------------------------------------------------------------------------
def _planted_trace() -> pd.DataFrame:
    rows = [{"step": s, "layer": l, "head": h, "metric": "successor_mass", "value": 0.1 * (i + l + h)}
            for i, s in enumerate((0, 100, 200)) for l in range(2) for h in range(2)]
    return pd.DataFrame(rows).astype({"layer": "Int64", "head": "Int64"})


def test_saving_a_slider_heatmap_as_an_image_writes_every_step(tmp_path, monkeypatch):
    exported = []
    monkeypatch.setitem(plots._EXPORTER, "result", (lambda fig, fmt, w, h, s: exported.append(fig) or b"img", None))
    fig = plots.head_heatmap(_planted_trace(), "successor_mass")
    assert [tr.visible for tr in fig.data] == [False, False, True]  # on screen: one step at a time
    plots.save(fig, tmp_path / "h.png")
    static = exported[0]
    assert len(static.data) == 3 and all(tr.visible in (None, True) for tr in static.data)
    assert [a.text for a in static.layout.annotations] == ["step 0", "step 100", "step 200"]
    assert np.allclose(np.asarray(static.data[1].z, float), [[0.1, 0.2], [0.2, 0.3]])
    assert (tmp_path / "h.png").read_bytes() == b"img"
    assert plots.static_figure(plots.head_heatmap(_planted_trace(), "successor_mass", step=100)).data[0].visible


def test_other_slider_figures_warn_that_only_the_visible_state_is_exported():
    fig = plots.go.Figure([plots.go.Bar(y=[1]), plots.go.Bar(y=[2], visible=False)])
    fig.update_layout(sliders=[dict(steps=[dict(method="update", args=[{"visible": [True, False]}])])])
    with pytest.warns(UserWarning, match="only its visible state"):
        assert plots.static_figure(fig) is fig


def test_markdown_table_transposed():
    df = pd.DataFrame({"run": ["r0"], "successor_mass_first_step": [300], "after": [None]})
    assert markdown_table(df, transpose=True).splitlines() == [
        "| column | value |", "|---|---|", "| run | r0 |", "| successor_mass_first_step | 300 |", "| after | NA |"]
    two = markdown_table(pd.concat([df, df]), transpose=True).splitlines()
    assert two[0] == "| column | 0 | 1 |" and two[2] == "| run | r0 | r0 |"


# --------------------------------------------------------------------------------------
# 9. progress bars in notebooks without the IProgress warning
# --------------------------------------------------------------------------------------
def test_progress_bar_in_a_notebook_without_ipywidgets_is_quiet(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # import fails
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bar = progress_bar(range(3), disable=True)
    from tqdm.std import tqdm as text_bar
    assert type(bar) is text_bar and list(bar) == [0, 1, 2]


def test_progress_bar_in_a_notebook_with_ipywidgets_is_the_widget(monkeypatch):
    class Widget:
        def __init__(self, iterable=None, **kw):
            self.kw = kw

    monkeypatch.setitem(sys.modules, "ipykernel.zmqshell", types.ModuleType("ipykernel.zmqshell"))
    monkeypatch.setitem(sys.modules, "ipywidgets", types.ModuleType("ipywidgets"))
    monkeypatch.setitem(sys.modules, "tqdm.notebook", types.SimpleNamespace(tqdm=Widget))
    assert isinstance(progress_bar(range(3), desc="x"), Widget)
    monkeypatch.delitem(sys.modules, "ipykernel.zmqshell")
    assert not isinstance(progress_bar(range(3), disable=True), Widget)  # a terminal: the text bar


def test_pattern_and_step_pattern_are_refused_where_they_would_be_ignored():
    models = [tiny_model(0), tiny_model(1)]
    for kw in ({"pattern": "step*"}, {"step_pattern": r"(\d+)"}, {"key": "model"}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))}= applies to"):
            attach(models, **kw)
