"""Tests for circuitfade.store: checkpoint series, attaching any checkpoints, trace."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file

from circuitfade import compat
from circuitfade.gating.evaluation import evaluate_batch
from circuitfade.io import CheckpointError, load_tensors
from circuitfade.gating.paths import parse_path
from circuitfade.store import CheckpointSeries, Snapshot, attach, load_hf_local, metric, open_run, trace
from circuitfade.gating import NoGatesError as NoGates
from circuitfade.train import RunConfig, TrainConfig, read_metrics, train

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 20-step circuitfade run with checkpoints at 0, 10, 20 and gate path fade5+5->0."""
    d = tmp_path_factory.mktemp("runs") / "fade-s3"
    cfg = RunConfig(
        path="fade5+5->0",
        model={"d_model": 32, "n_heads": 2, "d_head": 16},
        train=TrainConfig(steps=20, checkpoint_every=10, eval_every=10, eval_size=64),
        seed=3,
    )
    train(cfg, d, progress=False)
    return d


LINE_MODEL = "TransformerBridge" if compat.is_tl4() else "HookedTransformer"  # the installed line's plain model


def ht_config(**kw):
    """A plain-model config (``HookedTransformerConfig`` on TransformerLens 3, ``TransformerBridgeConfig`` on 4)."""
    base = dict(n_layers=2, d_model=32, n_ctx=16, d_head=8, n_heads=4, d_vocab=20, attn_only=True, seed=0)
    base.update(kw)
    return compat.make_config(base)


def ht_model(cfg, seed: int):
    torch.manual_seed(seed)
    m = compat.plain_model(cfg)
    with torch.no_grad():  # perturb every weight so each "step" differs from the init
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return m.eval()


def config_json(cfg) -> dict:
    """All JSON-able constructor fields of a plain-model config (dtype as a string)."""
    out = {}
    for name in sorted(compat.config_fields()):
        if not hasattr(cfg, name):
            continue
        v = getattr(cfg, name)
        if isinstance(v, torch.dtype):
            v = str(v)
        try:
            json.dumps(v)
        except TypeError:
            continue
        out[name] = v
    return out


def state_key(model: torch.nn.Module, weight: torch.Tensor) -> str:
    """The key of ``model.state_dict()`` whose tensor holds ``weight`` (a weight view such as
    ``model.blocks[1].attn.W_O``): ``blocks.1.attn.W_O`` on a ``HookedTransformer``, the fused
    ``blocks.1.attn.o.weight`` on a ``TransformerBridge``."""
    ptr = weight.untyped_storage().data_ptr()
    keys = [k for k, v in model.state_dict().items() if v.untyped_storage().data_ptr() == ptr]
    assert len(keys) == 1, keys
    return keys[0]


def same_weights(a: torch.nn.Module, b: torch.nn.Module | dict) -> bool:
    sa = a.state_dict()
    sb = b if isinstance(b, dict) else b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class NotWeights:  # pickled into a .pt file; weights_only loading must refuse it
    def __init__(self):
        self.payload = "code"


# --------------------------------------------------------------------------------------
# circuitfade runs
# --------------------------------------------------------------------------------------
def test_open_run_series(run_dir):
    series = open_run(run_dir)
    assert len(series) == 3 and series.steps == [0, 10, 20]
    for step, model in series:
        assert not model.training
        assert same_weights(model, load_tensors(run_dir / "checkpoints" / f"step_{step:06d}.safetensors"))
    assert same_weights(series[10], load_tensors(run_dir / "checkpoints" / "step_000010.safetensors"))
    with pytest.raises(KeyError, match=r"step 5 .*available steps: \[0, 10, 20\]"):
        series[5]
    assert series.metadata["seed"] == 3 and series.metadata["path"] == "fade5+5->0"
    assert series.metadata["run"] == "fade-s3" and series.metadata["run_dir"] == str(run_dir.resolve())
    assert series.metadata["task"] == "assoc" and series.task is not None
    r = repr(series)
    assert "3 snapshots" in r and "[0, 10, 20]" in r and "fade-s3" in r


def test_range_select_and_attach_dispatch(run_dir):
    series = attach(run_dir)
    assert series.steps == [0, 10, 20] and series.metadata["path"] == "fade5+5->0"
    assert series.range(start=10).steps == [10, 20]
    assert series.range(stop=10).steps == [0, 10]  # inclusive
    assert series.range(every=20).steps == [0, 20]
    assert series.range(10, 20, every=10).steps == [10, 20]
    sub = series.select([20, 0])
    assert sub.steps == [0, 20] and sub.metadata == series.metadata and sub.gate_zero_step() == 10
    with pytest.raises(KeyError, match="available steps"):
        series.select([0, 7])
    assert attach(run_dir, steps=[10]).steps == [10]
    assert attach(run_dir, metadata={"label": "x"}).metadata["label"] == "x"
    with pytest.raises(ValueError, match="config= applies to state-dict files only"):
        attach(run_dir, config=ht_config())


def test_gate_zero_step(run_dir):
    series = open_run(run_dir)
    # fade5+5->0: 0.5 up to step 5, linear to 0 at step 10, 0 afterwards
    assert series.gate_zero_step() == 10
    assert series.gate_value(5) == 0.5 and series.gate_value(7) == pytest.approx(0.3)
    assert series.gate_value(10) == 0.0

    def empty(spec: str, span=(0, 100)) -> CheckpointSeries:
        return CheckpointSeries([], gate_path=parse_path(spec, total_steps=span[1]), gate_span=span)

    assert empty("unforced").gate_zero_step() is None
    assert empty("forced_zero", (40, 100)).gate_zero_step() == 40
    assert empty("forced_const0.5").gate_zero_step() is None
    assert empty("switch@30").gate_zero_step() == 30
    assert empty("linear0.5->0").gate_zero_step() == 100
    assert CheckpointSeries([]).gate_zero_step() is None  # no gate path at all


def test_open_run_refuses_non_runs(tmp_path):
    with pytest.raises(CheckpointError, match="not a circuitfade run directory"):
        open_run(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"path": "unforced", "task": {"name": "assoc"}, "model": {},
                                                      "train": {}, "seed": 0}))
    with pytest.raises(CheckpointError, match="without complete checkpoints"):
        open_run(tmp_path)


# --------------------------------------------------------------------------------------
# user checkpoints of plain models (HookedTransformer / TransformerBridge state dicts)
# --------------------------------------------------------------------------------------
@pytest.fixture()
def ht_ckpts(tmp_path):
    cfg = ht_config()
    m100, m200 = ht_model(cfg, 1), ht_model(cfg, 2)
    folder = tmp_path / "ckpts"
    folder.mkdir()
    torch.save(m100.state_dict(), folder / "ckpt_step100.pt")
    save_file({k: v.contiguous() for k, v in m200.state_dict().items()}, str(folder / "ckpt_step200.safetensors"))
    cfg_file = tmp_path / "ht_config.json"
    cfg_file.write_text(json.dumps(config_json(cfg)))
    return folder, cfg, cfg_file, {100: m100, 200: m200}


def test_attach_user_checkpoints(ht_ckpts):
    folder, cfg, cfg_file, models = ht_ckpts
    for config in (cfg_file, cfg, config_json(cfg)):
        series = attach(folder, config=config)
        assert series.steps == [100, 200]
        for step, model in series:
            assert type(model) is type(models[step]) and not model.training
            assert same_weights(model, models[step])
        toks = torch.randint(0, 20, (2, 16), generator=torch.Generator().manual_seed(0))
        assert torch.equal(series[200](toks), models[200](toks))
    assert series.metadata["run"] == "ckpts"
    # explicit steps override the numbers in the names (natural-sort order of names)
    assert attach(folder, config=cfg, steps=[1, 2]).steps == [1, 2]
    # pattern, single file, list of one file
    assert attach(folder, config=cfg, pattern="*.pt").steps == [100]
    assert attach(folder / "ckpt_step200.safetensors", config=cfg).steps == [200]
    one = attach([folder / "ckpt_step100.pt"], config=cfg)
    assert one.steps == [100] and same_weights(one[100], models[100])
    assert attach({7: folder / "ckpt_step100.pt"}, config=cfg).steps == [7]
    # config.json next to the files is picked up
    (folder / "config.json").write_text(cfg_file.read_text())
    assert attach(folder).steps == [100, 200]


def test_user_checkpoint_steps_from_names(tmp_path):
    cfg = ht_config(n_layers=1)
    sd = ht_model(cfg, 0).state_dict()
    for name in ("model-000300.safetensors", "model-000020.safetensors", "model-1000.safetensors"):
        save_file(sd, str(tmp_path / name))
    assert attach(tmp_path, config=cfg).steps == [20, 300, 1000]
    save_file(sd, str(tmp_path / "final.safetensors"))  # beside numbered files: left out, named
    with pytest.warns(UserWarning, match=r"left out \['final\.safetensors'\].*pattern="):
        assert attach(tmp_path, config=cfg).steps == [20, 300, 1000]
    with pytest.raises(ValueError, match="steps= has 2 entries"):
        attach(tmp_path, config=cfg, steps=[1, 2])


def test_user_checkpoint_needs_config(ht_ckpts):
    folder = ht_ckpts[0]
    with pytest.raises(CheckpointError, match="need a model config"):
        attach(folder)


def test_pickled_object_is_refused(ht_ckpts):
    folder, cfg, _, _ = ht_ckpts
    torch.save({"x": NotWeights()}, folder / "ckpt_step300.pt")
    with pytest.raises(CheckpointError, match=r"ckpt_step300\.pt.*refused"):
        attach(folder, config=cfg)


def test_truncated_safetensors(ht_ckpts):
    folder, cfg, _, _ = ht_ckpts
    raw = (folder / "ckpt_step200.safetensors").read_bytes()
    (folder / "ckpt_step300.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match=r"ckpt_step300\.safetensors"):
        attach(folder, config=cfg)


def test_truncated_pt(ht_ckpts):
    folder, cfg, _, _ = ht_ckpts
    raw = (folder / "ckpt_step100.pt").read_bytes()
    (folder / "ckpt_step300.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match=r"ckpt_step300\.pt"):
        attach(folder, config=cfg)


def test_wrong_shape(ht_ckpts):
    folder, cfg, _, _ = ht_ckpts
    wide = ht_model(ht_config(d_model=48), 0)
    torch.save(wide.state_dict(), folder / "ckpt_step300.pt")
    with pytest.raises(CheckpointError, match=r"ckpt_step300\.pt.*shape mismatch.*\(48") as e:
        attach(folder, config=cfg)
    assert state_key(wide, wide.W_E) in str(e.value)  # embed.W_E (3.x) / embed.weight (4.x)


def test_missing_and_unexpected_keys(ht_ckpts):
    folder, cfg, _, models = ht_ckpts
    sd = dict(models[100].state_dict())
    w_o = state_key(models[100], models[100].blocks[1].attn.W_O)  # blocks.1.attn.W_O / blocks.1.attn.o.weight
    sd.pop(w_o)
    sd["extra.weight"] = torch.zeros(3)
    torch.save(sd, folder / "ckpt_step300.pt")
    with pytest.raises(CheckpointError, match=rf"ckpt_step300\.pt.*missing 1 tensors.*{re.escape(w_o)}.*unexpected 1"):
        attach(folder, config=cfg)


def test_file_changed_after_attach_is_caught_at_load(ht_ckpts):
    folder, cfg, _, _ = ht_ckpts
    series = attach(folder, config=cfg)
    (folder / "ckpt_step200.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"ckpt_step200\.safetensors"):
        series[200]


def test_unknown_sources(tmp_path):
    with pytest.raises(ValueError, match="accepted sources"):
        attach(3.5)
    with pytest.raises(ValueError, match="only models or only file paths"):
        attach([compat.plain_model(ht_config()), "x.pt"])
    with pytest.raises(CheckpointError, match="no such file"):
        attach(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no checkpoints found"):
        attach(tmp_path)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match="notes.txt: not a checkpoint file"):
        attach(tmp_path / "notes.txt")


# --------------------------------------------------------------------------------------
# in-memory models
# --------------------------------------------------------------------------------------
def test_in_memory_models():
    cfg = ht_config()
    ms = [ht_model(cfg, s) for s in range(3)]
    series = attach(ms)
    assert series.steps == [0, 1, 2] and series[1] is ms[1]
    assert [m for _, m in series] == ms
    assert attach(ms, steps=[10, 20, 30]).steps == [10, 20, 30]
    d = attach({300: ms[2], 100: ms[0]})
    assert d.steps == [100, 300] and d[300] is ms[2]
    assert "2 in-memory models" in repr(d)
    assert attach(ms[0]).steps == [0]


# --------------------------------------------------------------------------------------
# local Hugging Face revision series
# --------------------------------------------------------------------------------------
def _neox(seed: int):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    c = transformers.GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                   vocab_size=64, max_position_embeddings=64)
    return transformers.GPTNeoXForCausalLM(c).eval()


def test_hf_revision_series(tmp_path):
    hf = {100: _neox(1), 200: _neox(2)}
    root = tmp_path / "llama-named-folder"  # TL picks architectures by name substrings: must not matter
    for step, m in hf.items():
        m.save_pretrained(root / f"step{step}")
    series = attach(root)
    assert series.steps == [100, 200] and series.metadata["architecture"] == "GPTNeoXForCausalLM"
    toks = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(0))
    for step, model in series:
        assert type(model).__name__ == LINE_MODEL and compat.is_tl_model(model)
        with torch.no_grad():
            ref = hf[step](toks).logits
            assert torch.allclose(model(toks), ref, atol=1e-4)
    # TL's weight processing changes logits by a per-position constant only
    processed = load_hf_local(root / "step200", process=True)
    with torch.no_grad():
        got = processed(toks).log_softmax(-1)
        assert torch.allclose(got, hf[200](toks).logits.log_softmax(-1), atol=1e-4)
    assert attach(root / "step100").steps == [100]  # a single model directory
    assert attach(root, steps=[1, 2]).steps == [1, 2]


def test_hf_gpt2(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    c = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64)
    hf = transformers.GPT2LMHeadModel(c).eval()
    hf.save_pretrained(tmp_path / "revision-2000")
    series = attach(tmp_path)
    assert series.steps == [2000]
    toks = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(series[2000](toks), hf(toks).logits, atol=1e-4)


def test_hf_tokenizer_loaded_from_the_folder(tmp_path):
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(60)} | {"<unk>": 60, "<bos>": 61, "<eos>": 62, "<pad>": 63}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>",
                                                eos_token="<eos>", pad_token="<pad>")
    _neox(0).save_pretrained(tmp_path / "step1")
    fast.save_pretrained(tmp_path / "step1")
    model = load_hf_local(tmp_path / "step1")
    assert model.tokenizer is not None
    assert model.to_tokens("w1 w2 w3", prepend_bos=False).tolist() == [[1, 2, 3]]


def test_hf_unsupported_architecture(tmp_path):
    m = tmp_path / "step5"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"]}))
    save_file({"w": torch.zeros(2)}, str(m / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"step5: unsupported Hugging Face architecture 'BertForMaskedLM'"):
        attach(tmp_path)
    with pytest.raises(CheckpointError, match="unsupported"):
        load_hf_local(m)


# --------------------------------------------------------------------------------------
# trace
# --------------------------------------------------------------------------------------
def uniform_model(fill: float):
    """Attention-only model with W_Q = b_Q = 0: every head attends uniformly (causally).

    Mean attention to key 0 over query positions 0..P-1 is then (1/P) * sum_i 1/(i+1).
    W_E is filled with ``fill`` so a weight metric has a known value.
    """
    m = compat.plain_model(ht_config())
    with torch.no_grad():
        for b in m.blocks:
            b.attn.W_Q.zero_()
            b.attn.b_Q.zero_()
        m.embed.W_E.fill_(fill)
    return m.eval()


def attn_to_first(model, batch):
    """[n_layers, n_heads] mean attention from every query position to key position 0."""
    tokens = batch if isinstance(batch, torch.Tensor) else batch.tokens
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    return torch.stack([cache["pattern", l][:, :, :, 0].mean(dim=(0, 2)) for l in range(model.cfg.n_layers)])


def we_mean(model, batch, task):
    return float(model.W_E.mean())


def gate_metric(model, batch, task):
    if not hasattr(model, "gate_values"):
        raise NoGates()
    return 0.0


def test_trace_per_head_and_scalar_metrics():
    series = attach({100: uniform_model(1.0), 200: uniform_model(2.0)}, metadata={"run": "u", "seed": 7})
    tokens = torch.randint(0, 20, (4, 10), generator=torch.Generator().manual_seed(0))
    df = trace(series, [metric(attn_to_first, inputs=("model", "batch")), we_mean, gate_metric], batch=tokens,
               progress=False)
    L, H, P = 2, 4, 10
    assert len(df) == 2 * L * H + 2 + 2
    assert list(df.columns) == ["step", "layer", "head", "metric", "value", "se", "lo", "hi", "note", "run", "seed"]
    assert df[["se", "lo", "hi"]].isna().all().all()  # these metrics give no interval
    assert (df["run"] == "u").all() and (df["seed"] == 7).all()
    assert str(df["layer"].dtype) == "Int64" and str(df["head"].dtype) == "Int64"
    heads = df[df.metric == "attn_to_first"]
    assert len(heads) == 2 * L * H
    assert sorted(zip(heads["layer"], heads["head"])) == sorted([(l, h) for l in range(L) for h in range(H)] * 2)
    expected = sum(1 / (i + 1) for i in range(P)) / P
    np.testing.assert_allclose(heads.value.to_numpy(), expected, atol=1e-6)
    we = df[df.metric == "we_mean"].set_index("step")
    assert we.value.to_dict() == {100: 1.0, 200: 2.0}
    assert we["layer"].isna().all() and we["head"].isna().all()
    ng = df[df.metric == "gate_metric"]
    assert len(ng) == 2 and ng.value.isna().all() and (ng.note == "no gates").all()
    assert df[df.metric != "gate_metric"].note.isna().all()


def test_trace_run_uses_its_task_and_eval_set(run_dir):
    series = open_run(run_dir)

    def evaluation(model, batch, task):
        return evaluate_batch(model, task, batch)

    df = trace(series, {"eval": evaluation, "gate": gate_metric}, n=64, progress=False)
    assert set(df.metric) == {"eval.loss", "eval.accuracy", "gate"}
    assert {"run", "run_dir", "path", "seed", "task"} <= set(df.columns)
    assert (df.path == "fade5+5->0").all() and (df.seed == 3).all()
    # same eval batch as the trainer (n = eval_size, trainer's eval seed): same numbers as metrics.csv
    m = read_metrics(run_dir).set_index("step")
    loss = df[df.metric == "eval.loss"].set_index("step").value
    np.testing.assert_allclose(loss.to_numpy(), m.loc[[0, 10, 20], "loss_normal"].to_numpy(), atol=1e-5)
    assert df[df.metric == "gate"].note.isna().all()  # SoftPriorTransformer has gates


def test_trace_dataframe_metric_and_errors():
    series = attach([uniform_model(0.0)])

    @metric(inputs=("model", "batch"))
    def table(model, batch):
        return pd.DataFrame({"layer": [0, 1], "metric": ["a", "b"], "value": [1.0, 2.0], "condition": ["x", "y"]})

    df = trace(series, {"t": table}, batch=torch.zeros(1, 4, dtype=torch.long), progress=False)
    assert list(df.metric) == ["a", "b"] and list(df.condition) == ["x", "y"] and df["head"].isna().all()
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        trace(series, {"bad": metric(lambda m: torch.zeros(3), inputs="model")}, progress=False)
    with pytest.raises(ValueError, match="duplicate metric names"):
        trace(series, [we_mean, we_mean], progress=False)
    with pytest.raises(RuntimeError, match="boom"):  # errors outside skip_errors propagate
        trace(series, {"x": metric(lambda m: (_ for _ in ()).throw(RuntimeError("boom")), inputs="model")},
              progress=False)
    with pytest.raises(ValueError, match="this series has no task; pass task="):
        trace(series, [we_mean], progress=False)  # needs (model, batch, task), and there is no task
    with pytest.raises(ValueError, match="metric inputs"):
        metric(we_mean, inputs=("batch", "model"))


def test_snapshot_validation():
    with pytest.raises(ValueError, match="duplicate step 1"):
        CheckpointSeries([Snapshot(1, lambda: None, "a"), Snapshot(1, lambda: None, "b")])
    with pytest.raises(ValueError, match="integer"):
        Snapshot(1.5, lambda: None, "a")
