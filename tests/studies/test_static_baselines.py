"""Static-baselines experiment: the method configs (the paper's thirteen, on the model), configs reproduce them,
tables, end-to-end tiny run."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from studies.paper import static_baselines as sb
from studies.paper.static_baselines import STATIC_METHODS, method_config

from circuitfade.train.sweep import run_key
from circuitfade.train import RunConfig, TrainConfig, train
from circuitfade.model import SoftPriorTransformer
from circuitfade.model.priors import PRIORS

TC = TrainConfig(steps=10, eval_every=5, eval_size=32, batch_size=8, checkpoint_every=10)
FIXED = {"alibi", "learned_rpe", "dape", "cope", "fire", "kerple"}


@pytest.mark.parametrize("task", list(sb.TASKS))
@pytest.mark.parametrize("method", list(STATIC_METHODS))
def test_run_config_reproduces_method_config(method, task):
    cfg = sb.static_config(method, task, 0, TC)
    got = cfg.model_config()
    want = method_config(method, **getattr(cfg.make_task(), "model_overrides", {}))
    for field in ("priors", "positional_embedding_type", "gate_init", "input_mode", "d_vocab", "n_ctx",
                  "n_layers", "d_model", "n_heads", "d_head", "attn_only"):
        assert getattr(got, field) == getattr(want, field), field
    assert {p: got.gate_mode(p) for p in got.priors} == {p: want.gate_mode(p) for p in want.priors}
    assert cfg.path == ("forced_const1" if method in FIXED else "unforced")
    assert cfg.gate_path().mode == ("fixed" if method in FIXED else "learned")
    assert cfg.task == sb.TASKS[task]


def test_markov_runs_at_p_0_2():
    assert sb.static_config("nope", "markov", 0, TC).make_task().config.p == 0.2


@pytest.mark.parametrize("method", list(STATIC_METHODS))
def test_gates_at_step_zero_are_the_methods(method):
    """The step-0 record holds the gate the trainer sets: 1 for published biases, the
    init for learned gates (0.5; GPSA sigmoid(1)), and no gate for prior-free methods."""
    tc = TrainConfig(steps=1, eval_every=1, eval_size=8, batch_size=4, eval_conditions=("normal",))
    run = train(sb.static_config(method, "assoc", 0, tc), None, progress=False)
    assert run.metrics[0]["step"] == 0
    gates = {k: v for k, v in run.metrics[0].items() if k.startswith("gate_")}
    priors = STATIC_METHODS[method]["priors"]
    assert sorted(gates) == sorted(f"gate_{p}" for p in priors)
    want = 1.0 if method in FIXED else (1 / (1 + math.exp(-1)) if method == "gpsa" else 0.5)
    for v in gates.values():
        assert v == pytest.approx(want, abs=1e-6)
    pe = STATIC_METHODS[method]["positional_embedding_type"]
    assert run.model.cfg.positional_embedding_type == pe
    for p in priors:
        logit = run.model.blocks[0].attn.get_parameter(f"gate_{p}_logit")
        assert logit.requires_grad == (method not in FIXED)


def test_model_dicts_are_minimal_so_runs_are_shared():
    assert sb.method_model("soft_bias") == {}  # the default model: shared with the main paper's unforced runs
    assert sb.method_model("nope") == {"priors": []}
    assert sb.method_model("alibi") == {"priors": ["alibi"], "gate_modes": {"alibi": "fixed"}, "gate_init": 1.0}
    shared = RunConfig(path="unforced", task={"name": "assoc"}, train=TC, seed=0)
    assert run_key(sb.static_config("soft_bias", "assoc", 0, TC)) == run_key(shared)
    with pytest.raises(ValueError, match="unknown static method"):
        sb.method_model("transformer_xl")


def test_experiment_configs_layout():
    entries = sb.experiment_configs([0, 1], tasks=("assoc", "linreg"), train=TC, fade_path="fade2+3->0")
    static = [e for e in entries if e.experiment == "static"]
    rem = [e for e in entries if e.experiment == "removability"]
    assert len(static) == 2 * 13 * 2
    assert len(rem) == 2 * 3 * 3 * 2  # tasks x (alibi, fire, t5) x (forced_const1, unforced, fade) x seeds
    paths = {(e.method, e.config.path) for e in rem}
    assert paths == {(p, q) for p in ("alibi", "fire", "t5") for q in ("forced_const1", "unforced", "fade2+3->0")}
    # the published form in the removability table *is* the static run
    pub = next(e for e in rem if e.method == "t5" and e.config.path == "forced_const1" and e.task == "assoc")
    assert run_key(pub.config) == run_key(sb.static_config("learned_rpe", "assoc", pub.config.seed, TC))
    un = next(e for e in rem if e.method == "fire" and e.config.path == "unforced")
    assert un.config.model_config().priors == ("fire",) and un.config.model_config().gate_init == 0.5
    with pytest.raises(ValueError, match="unknown task"):
        sb.experiment_configs([0], tasks=("copy",))


def _fake(rows):
    base = {"experiment": "static", "prior": "pos", "path": "unforced", "step": 10, "status": "done", "error": None,
            "run": "r"}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_tables_mean_sd_and_paper_numbers():
    rows = []
    for s, (a, z) in enumerate([(0.7, 0.1), (0.9, 0.3)]):
        rows += [dict(task="assoc", method="soft_pos_only", seed=s, metric="acc_normal", value=a, run=f"a{s}"),
                 dict(task="assoc", method="soft_pos_only", seed=s, metric="acc_zero", value=z, run=f"a{s}")]
    rows += [dict(task="linreg", method="nope", prior="", seed=0, metric="mse_normal", value=0.25),
             dict(task="linreg", method="nope", prior="", seed=1, status="failed", error="Boom: x", metric=None,
                  value=math.nan, run="bad")]
    res = _fake(rows)
    st = sb.static_table(res)
    r = st[st.method == "soft_pos_only"].iloc[0]
    assert r["mean"] == pytest.approx(0.8) and r.sd == pytest.approx(math.sqrt(0.02)) and r.n == 2
    assert r.zero_mean == pytest.approx(0.2) and r.paper_mean == 0.783
    lin = st[st.task == "linreg"].iloc[0]
    assert lin.metric == "mse" and lin.n == 1 and lin.failed == 1
    md = sb.to_markdown(res, label="QUICK (10 steps) — not comparable to the paper")
    assert "| soft_pos_only | NoPE + pos, gate learned | 0.800 ± 0.141 | 0.200 ± 0.141 | 2 | 0.783 |" in md
    assert "| NoPE (NoPE | " not in md and "| NoPE | NoPE | 0.250 | (no prior) | 1 (1 failed) |" in md
    assert "final MSE (lower is better)" in md and "1 run(s) failed" in md and "Boom: x" in md


def test_tiny_end_to_end(tmp_path):
    methods = ("nope", "alibi", "soft_bias", "soft_pos_only", "soft_content_only")
    kw = dict(executor="serial", tasks=("assoc",), methods=methods, fade_priors=("alibi",), train=TC,
              fade_path="fade2+3->0", progress=False)
    res, md = sb.run(1, tmp_path, **kw)
    assert set(res.status) == {"done"}
    st = sb.static_table(res)
    assert list(st.method) == list(methods) and set(st.n) == {1}
    assert "QUICK (10 steps) — not comparable to the paper" in md
    for paper in ("| 0.794 ± 0.022 |", "| 0.783 |", "| 0.067 |"):
        assert paper in md
    rm = sb.removability_table(res).set_index("path")
    assert list(rm.index) == ["forced_const1", "unforced", "fade2+3->0"]
    # the fade ends at gate 0: normal == zero-gate; the published row is the static alibi run
    assert rm.loc["fade2+3->0", "normal_mean"] == rm.loc["fade2+3->0", "zero_mean"]
    alibi = st.set_index("method").loc["alibi"]
    assert rm.loc["forced_const1", "zero_mean"] == alibi.zero_mean
    assert rm.loc["forced_const1", "normal_mean"] == alibi["mean"]
    assert 0 < rm.loc["unforced", "gate"] < 1
    # rerun: nothing retrained, same numbers
    res2, md2 = sb.run(1, tmp_path, **kw)
    assert set(res2.status) == {"cached"} and md2 == md


def test_main_writes_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sb, "QUICK_TRAIN", TC)
    rc = sb.main(["--seeds", "1", "--out", str(tmp_path), "--quick", "--tasks", "assoc", "--methods", "nope",
                  "--fade-priors", "--executor", "serial", "--no-progress"])
    assert rc == 0
    md = (tmp_path / "results.md").read_text()
    assert "| NoPE | NoPE |" in md and md.strip() in capsys.readouterr().out
    csv = pd.read_csv(tmp_path / "static_baselines.csv")
    assert set(csv.method) == {"nope"} and "acc_normal" in set(csv.metric)


def test_static_is_a_paper_study_command(tmp_path, monkeypatch, capsys):
    from planted import run_study

    with pytest.raises(SystemExit) as e:
        run_study("paper", ["static", "--help"])
    assert e.value.code == 0
    assert "python -m studies.paper static" in (out := capsys.readouterr().out) and "--fade-priors" in out
    monkeypatch.setattr(sb, "QUICK_TRAIN", TC)
    rc = run_study("paper", ["static", "--seeds", "1", "--out", str(tmp_path), "--quick", "--tasks", "assoc", "--methods",
                   "nope", "--fade-priors", "--executor", "serial", "--no-progress"])
    assert rc == 0 and "| NoPE | NoPE |" in (tmp_path / "results.md").read_text()
    assert set(pd.read_csv(tmp_path / "static_baselines.csv").method) == {"nope"}


def test_step_time_ms_columns_and_threads_restored():
    before = torch.get_num_threads()
    df = sb.step_time_ms(["alibi"], steps=1, rounds=1, warmup=0, batch_size=4, threads=1)
    assert list(df.prior) == ["none", "alibi"] and df.ratio.iloc[0] == 1.0 and (df.ms > 0).all()
    assert df.ratio.iloc[1] == pytest.approx(df.ms.iloc[1] / df.ms.iloc[0])
    assert torch.get_num_threads() == before


def _tokens(batch: int = 2, n: int = 32, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 32, (batch, n), generator=torch.Generator().manual_seed(seed))


# -- the method configs on the model -----------------------------------------------------------
def test_static_methods_cover_the_papers_thirteen_baselines():
    assert sorted(STATIC_METHODS) == sorted(
        ["vanilla", "nope", "rope", "alibi", "learned_rpe", "dape", "cope", "fire", "kerple", "gpsa",
         "soft_bias", "soft_pos_only", "soft_content_only"]
    )  # fmt: skip
    tokens = _tokens(batch=1, n=12)
    for name in STATIC_METHODS:
        model = SoftPriorTransformer(method_config(name, seed=0))
        assert model(tokens).shape == (1, 12, 32), name
        for prior in model.cfg.priors:
            assert prior in PRIORS


def test_method_config_values_and_overrides():
    cfg = method_config("alibi", n_layers=3)
    assert cfg.n_layers == 3 and cfg.priors == ("alibi",) and cfg.positional_embedding_type == "none"
    assert cfg.gate_mode("alibi") == "fixed" and cfg.gate_init == 1.0
    assert method_config("rope").positional_embedding_type == "rotary"
    assert method_config("vanilla").positional_embedding_type == "standard"
    assert method_config("soft_bias").priors == ("pos", "content")
    assert method_config("gpsa").gate_init == pytest.approx(1 / (1 + math.exp(-1)))
    method_config("kerple").gate_modes["kerple_log"] = "learned"  # a copy: the table is unchanged
    assert STATIC_METHODS["kerple"]["gate_modes"] == {"kerple_log": "fixed"}
    with pytest.raises(ValueError, match="unknown static method"):
        method_config("sinusoidal")


@pytest.mark.parametrize("name", ["vanilla", "nope", "rope"])
def test_backbone_only_methods_equal_plain_hooked_transformer(name):
    model = SoftPriorTransformer(method_config(name, seed=0))
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), model.to_plain_model()(tokens), atol=1e-5, rtol=0)


def test_rotary_backbone_with_a_prior_fades_to_the_backbone():
    model = SoftPriorTransformer(method_config("rope", priors=("kerple_log",), seed=0))
    tokens = _tokens()
    with torch.no_grad(), model.gates(kerple_log=0.0):
        torch.testing.assert_close(model(tokens), model.to_plain_model()(tokens), atol=1e-5, rtol=0)
