"""Your own checkpoints, read right: step numbers from the common naming schemes, full training
checkpoints, TransformerLens 3.9 configs, a Batch as the task, traces that survive a file,
static figures. Every case is planted in a temporary folder with a known answer."""

from __future__ import annotations

import json
import re
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
from circuitfade.store import attach, load_trace, save_trace, step_from_name, trace
from circuitfade.store.sources import NAMING_SCHEMES
from circuitfade.store.tracing import progress_bar
from circuitfade.compat import TL39_ONLY_DEFAULTS
from circuitfade.commands.analyze import analyze_main
from circuitfade.tasks import eval_set
from circuitfade.viz import export, plots
from circuitfade.viz.tables import markdown_table
from planted import CopyTask
from repo_root import REPO

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


@pytest.mark.parametrize("name", ["run_3_seed_1", "step10_step20", "ckpt3_model4", "epoch_3_100"])
def test_ambiguous_names_are_refused(name):
    with pytest.raises(ValueError, match="several"):
        step_from_name(name)


@pytest.mark.parametrize("name", ["run3_seed1", "lr0.5_bs32_e3", "model_bf16", "gpt2_v2", "model_2L", "lr1e-3"])
def test_digits_that_belong_to_a_word_are_no_step(name):
    assert step_from_name(name) is None


def test_the_step_table_of_the_page_is_what_step_from_name_reads():
    page = (REPO / "docs" / "own-checkpoints.md").read_text()
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| (\d+) \|", page, re.MULTILINE)
    assert len(rows) >= len(NAMING_SCHEMES)
    for name, step in rows:
        stem = name.rstrip("/")
        stem = stem.rsplit(".", 1)[0] if re.search(r"\.(pt|pth|bin|ckpt|safetensors)$", stem) else stem
        assert step_from_name(stem) == int(step), name
    assert {n for n, _ in NAMING_SCHEMES} <= {n.rstrip("/") for n, _ in rows}


def test_thousands_suffixes_are_read_and_word_digits_are_not_steps(tmp_path):
    models = plant(tmp_path / "k", ["model_1k.pt", "model_2k.pt", "model_2.5k.pt"])
    series = attach(tmp_path / "k")
    assert series.steps == [1000, 2000, 2500] and same(series[2500], models["model_2.5k.pt"])
    plant(tmp_path / "one", ["model_2L_300.pt"])
    assert attach(tmp_path / "one").steps == [300]  # 2L is the depth, not the step
    plant(tmp_path / "ten", ["ckpt_10k.pt"])
    assert attach(tmp_path / "ten").steps == [10000]
    assert step_from_name("gpt2_bf16_step40_v2") == 40
    with pytest.raises(ValueError, match=r"1\.2345k is not a whole number of steps"):
        step_from_name("model_1.2345k")


@pytest.mark.parametrize("names", [["checkpoint_epoch_1.pt", "checkpoint_epoch_3.pt"],
                                   ["model_epoch_1_loss_0.70.pt", "model_epoch_3_loss_0.42.pt"]])
def test_epoch_only_names_are_refused_unless_steps_per_epoch_is_given(tmp_path, names):
    models = plant(tmp_path / "c", names)
    with pytest.raises(CheckpointError, match=rf"{re.escape(names[0])}: the name .* states epoch 1 but no step, and "
                                              r"an epoch is not a step: pass steps_per_epoch="):
        attach(tmp_path / "c")
    series = attach(tmp_path / "c", steps_per_epoch=50)
    assert series.steps == [50, 150] and same(series[150], models[names[1]])
    assert attach(tmp_path / "c", steps=[7, 9]).steps == [7, 9]
    with pytest.raises(ValueError, match="steps_per_epoch= must be a positive integer"):
        attach(tmp_path / "c", steps_per_epoch=0)
    assert step_from_name("epoch=3-step=300", steps_per_epoch=50) == 300  # a stated step wins


def test_a_final_or_latest_file_beside_numbered_ones_is_left_out_with_a_warning(tmp_path):
    models = plant(tmp_path / "c", ["model_100.pt", "model_200.pt", "model_final.pt", "latest.pt"])
    with pytest.warns(UserWarning, match=r"left out \['latest\.pt', 'model_final\.pt'\].*pattern="):
        series = attach(tmp_path / "c")
    assert series.steps == [100, 200] and same(series[200], models["model_200.pt"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert attach(tmp_path / "c", pattern="model_[0-9]*.pt").steps == [100, 200]


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


def lightning_checkpoint(model, epoch: int, step: int, hparams: dict | None = None) -> dict:
    """What PyTorch Lightning's ``trainer.save_checkpoint`` writes for a LightningModule holding
    the model as ``self.model`` (its keys, without needing lightning installed)."""
    return {
        "epoch": epoch, "global_step": step, "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"completed": epoch}}}},
        "callbacks": {"ModelCheckpoint{'monitor': None}": {"best_model_score": None, "dirpath": "ckpts"}},
        "optimizer_states": [_optimizer_state(tiny_model(0))], "lr_schedulers": [],
        "hparams_name": "kwargs", "hyper_parameters": {"lr": 1e-3, **(hparams or {})},
    }


def test_lightning_checkpoints_attach_with_their_steps_and_prefix(tmp_path):
    folder = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    models = {}
    for epoch, step in ((0, 100), (2, 300)):
        models[step] = tiny_model(step)
        torch.save(lightning_checkpoint(models[step], epoch, step), folder / f"epoch={epoch}-step={step}.ckpt")
    torch.save(lightning_checkpoint(models[300], 2, 300), folder / "last.ckpt")  # save_last=True
    with pytest.warns(UserWarning, match=r"left out \['last\.ckpt'\]"):
        series = attach(folder, config=tiny_cfg())
    assert series.steps == [100, 300]
    assert same(series[100], models[100]) and same(series[300], models[300])
    torch.save(lightning_checkpoint(models[100], 0, 100), tmp_path / "epoch=0-step=100.ckpt")
    assert attach(tmp_path / "epoch=0-step=100.ckpt", config=tiny_cfg()).steps == [100]


def test_a_lightning_checkpoint_with_pickled_objects_is_refused_in_one_line_with_the_way_out(tmp_path):
    import argparse

    ckpt = lightning_checkpoint(tiny_model(1), 0, 100)
    ckpt["hyper_parameters"]["args"] = argparse.Namespace(lr=1e-3)  # save_hyperparameters() of parsed args
    torch.save(ckpt, tmp_path / "epoch=0-step=100.ckpt")
    with pytest.raises(CheckpointError) as e:
        attach(tmp_path / "epoch=0-step=100.ckpt", config=tiny_cfg())
    msg = str(e.value)
    assert "\n" not in msg and "step=100.ckpt: refused to load" in msg
    assert "argparse.Namespace" in msg and "['state_dict']" in msg


def test_a_head_split_the_file_records_is_checked(tmp_path):
    f = tmp_path / "epoch=0-step=100.ckpt"
    torch.save(lightning_checkpoint(tiny_model(1), 0, 100, {"n_heads": 2, "d_head": 8}), f)
    assert attach(f, config=tiny_cfg()).steps == [100]
    torch.save(lightning_checkpoint(tiny_model(1), 0, 100, {"config": {"n_heads": 4, "d_head": 4}}), f)
    with pytest.raises(CheckpointError, match=r"step=100\.ckpt: the file records n_heads=4, d_head=4 but the config "
                                              r"says n_heads=2, d_head=8"):
        attach(f, config=tiny_cfg())


def split_state_dict(n_heads: int, d_head: int, d_model: int = 64, d_vocab: int = 32, n_ctx: int = 32) -> dict:
    """A one-layer attention-only ``HookedTransformer``-format state dict (per-head ``W_Q``
    ``[n_heads, d_model, d_head]``), as TransformerLens 3.9 saves it."""
    g = torch.Generator().manual_seed(0)
    r = lambda *shape: 0.1 * torch.randn(*shape, generator=g)  # noqa: E731
    attn = {f"W_{x}": r(n_heads, d_model, d_head) for x in "QKV"} | {f"b_{x}": r(n_heads, d_head) for x in "QKV"}
    attn |= {"W_O": r(n_heads, d_head, d_model), "b_O": r(d_model)}
    return {"embed.W_E": r(d_vocab, d_model), "pos_embed.W_pos": r(n_ctx, d_model), "blocks.0.ln1.w": 1 + r(d_model),
            "blocks.0.ln1.b": r(d_model), **{f"blocks.0.attn.{k}": v for k, v in attn.items()},
            "ln_final.w": 1 + r(d_model), "ln_final.b": r(d_model), "unembed.W_U": r(d_model, d_vocab),
            "unembed.b_U": r(d_vocab)}


def fused_state_dict(n_heads: int, d_head: int, d_model: int = 64, d_vocab: int = 32, n_ctx: int = 32) -> dict:
    """The same model as TransformerLens 4.x saves it: fused ``q``/``k``/``v``/``o`` weights
    ``[n_heads*d_head, d_model]``, which look the same for 4 heads of 16 and 8 heads of 8."""
    sd = split_state_dict(n_heads, d_head, d_model, d_vocab, n_ctx)
    out = {"embed.weight": sd["embed.W_E"], "pos_embed.weight": sd["pos_embed.W_pos"],
           "blocks.0.ln1.weight": sd["blocks.0.ln1.w"], "blocks.0.ln1.bias": sd["blocks.0.ln1.b"],
           "ln_final.weight": sd["ln_final.w"], "ln_final.bias": sd["ln_final.b"],
           "unembed.weight": sd["unembed.W_U"].T.contiguous(), "unembed.bias": sd["unembed.b_U"]}
    for x in "qkv":
        w = sd[f"blocks.0.attn.W_{x.upper()}"]
        out[f"blocks.0.attn.{x}.weight"] = w.permute(0, 2, 1).reshape(n_heads * d_head, d_model).contiguous()
        out[f"blocks.0.attn.{x}.bias"] = sd[f"blocks.0.attn.b_{x.upper()}"].reshape(-1)
    out["blocks.0.attn.o.weight"] = sd["blocks.0.attn.W_O"].reshape(n_heads * d_head, d_model).T.contiguous()
    out["blocks.0.attn.o.bias"] = sd["blocks.0.attn.b_O"]
    return out


def ht_buffers(n_heads: int, d_head: int) -> dict:
    """The attention buffers a TransformerLens 3.9 ``HookedTransformer`` saves (none on 4.x)."""
    sd = plain_model(split_cfg(n_heads, d_head)).state_dict()
    return {k: v for k, v in sd.items() if k.endswith((".mask", ".IGNORE"))}


def split_cfg(n_heads: int, d_head: int):
    return make_config(dict(n_layers=1, d_model=64, n_heads=n_heads, d_head=d_head, n_ctx=32, d_vocab=32,
                            attn_only=True, act_fn=None))


def test_a_wrong_head_split_is_refused_for_per_head_tensors(tmp_path):
    torch.save({**split_state_dict(4, 16), **ht_buffers(4, 16)}, tmp_path / "step_1.pt")
    assert attach(tmp_path, config=split_cfg(4, 16)).steps == [1]
    with pytest.raises(CheckpointError, match=r"step_1\.pt: .*W_Q.*\(4, 64, 16\).*\(8, 64, 8\)"):
        attach(tmp_path, config=split_cfg(8, 8))


@pytest.mark.skipif(not compat.is_tl4(), reason="fused q/k/v state dicts are what TransformerLens 4.x saves; "
                    "3.9 refuses them as foreign (test_fused_files_are_foreign_on_tl39)")
def test_a_fused_checkpoint_head_split_is_checked_where_anything_records_it(tmp_path):
    sd = fused_state_dict(4, 16)
    torch.save({"model": sd, "config": {"n_heads": 4, "d_head": 16}, "step": 1}, tmp_path / "full.pt")
    assert attach(tmp_path / "full.pt", config=split_cfg(4, 16)).steps == [1]
    with pytest.raises(CheckpointError, match=r"full\.pt: the file records n_heads=4, d_head=16 but the config says "
                                              r"n_heads=8, d_head=8"):
        attach(tmp_path / "full.pt", config=split_cfg(8, 8))
    folder = tmp_path / "bare"
    folder.mkdir()
    torch.save(sd, folder / "step_1.pt")
    (folder / "config.json").write_text(json.dumps(config_dict(split_cfg(4, 16))))
    with pytest.raises(CheckpointError, match=r"bare/config\.json: n_heads=4 there but n_heads=8 in config="):
        attach(folder, config=split_cfg(8, 8))  # the config saved beside the files says otherwise
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert attach(folder, config=split_cfg(4, 16)).steps == [1]  # confirmed by config.json
    hand = dict(n_layers=1, d_model=64, n_heads=8, d_head=8, n_ctx=32, d_vocab=32, attn_only=True, act_fn=None)
    (folder / "config.json").write_text(json.dumps(hand))  # a wrong config written by hand, alone
    with pytest.warns(UserWarning, match=r"fused .* n_heads=8 x d_head=8 is the word of a hand-written config alone"):
        attach(folder)


@pytest.mark.skipif(compat.is_tl4(), reason="on 4.x fused files are native (the test above)")
def test_fused_files_are_foreign_on_tl39(tmp_path):
    torch.save(fused_state_dict(4, 16), tmp_path / "step_1.pt")
    with pytest.raises(CheckpointError, match=r"step_1\.pt: weights do not fit the config: missing"):
        attach(tmp_path, config=split_cfg(4, 16))


def test_a_file_in_another_dtype_than_the_config_is_refused_not_upcast(tmp_path):
    m = tiny_model(3)
    torch.save({k: v.bfloat16() if v.is_floating_point() else v for k, v in m.state_dict().items()},
               tmp_path / "step_5.pt")
    (tmp_path / "config.json").write_text(json.dumps(config_dict(tiny_cfg())))
    with pytest.raises(CheckpointError, match=r"step_5\.pt: the weights are stored as bfloat16 .* but the config's "
                                              r"dtype is float32; they are not converted: set dtype='bfloat16'"):
        attach(tmp_path)
    bf16 = tiny_model(3, tiny_cfg(dtype=torch.bfloat16))
    torch.save(bf16.state_dict(), tmp_path / "step_5.pt")
    (tmp_path / "config.json").write_text(json.dumps(config_dict(tiny_cfg(dtype=torch.bfloat16))))
    got = attach(tmp_path)[5]
    assert {p.dtype for p in got.parameters()} == {torch.bfloat16} and same(got, bf16)


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
    monkeypatch.setitem(export._EXPORTER, "result", (lambda fig, fmt, w, h, s: exported.append(fig) or b"img", None))
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
