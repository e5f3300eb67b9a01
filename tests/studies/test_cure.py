"""The withheld/cure experiment: the QK re-init path changes exactly the QK slices, the rules on planted outcomes."""

import numpy as np
import pandas as pd
import pytest
import torch

from studies.alignment import cure
from circuitfade.stats import binomial_exact_interval
from circuitfade.train import new_run, train


def test_exact_binomial_interval_known_values():
    assert binomial_exact_interval(0, 6) == (0.0, pytest.approx(1 - 0.025 ** (1 / 6), abs=1e-9))
    lo, hi = binomial_exact_interval(6, 6)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 6), abs=1e-9)
    lo, hi = binomial_exact_interval(3, 6)  # symmetric, tabulated Clopper-Pearson 0.1181, 0.8819
    assert lo == pytest.approx(0.1181, abs=1e-4) and hi == pytest.approx(1 - lo, abs=1e-9)
    with pytest.raises(ValueError):
        binomial_exact_interval(7, 6)


def test_withheld_mix_withholds_then_adds_the_capability():
    cfg = cure.withheld_config(0, 40, 60)
    assert cfg.mix_at(39)["p_capability"] == 0.0 and cfg.mix_at(40)["p_capability"] == cure.CAP_SHARE


def test_qk_cure_path_changes_exactly_the_qk_slices_of_the_parts():
    from circuitfade.train.surgery import reinit_slices

    torch.set_num_threads(1)
    run = new_run(cure.withheld_config(0, 10, 10))
    train(cure.withheld_config(0, 10, 10), None, run=run, progress=False)
    before = {n: p.detach().clone() for n, p in run.model.named_parameters()}
    opt_before = {id(p): {k: v.clone() for k, v in st.items() if torch.is_tensor(v)}
                  for p, st in run.optimizer.state.items()}
    reinit_slices(run.model, [(0, i) for i in range(cure.K)], which="qk", generator=torch.Generator().manual_seed(1))
    qk = {"W_Q", "b_Q", "W_K", "b_K"}
    for n, p in run.model.named_parameters():
        w = n.split(".")[-1]
        if w in qk and n.startswith("blocks.0.attn"):
            for h in range(p.shape[0]):
                same = torch.equal(p[h], before[n][h])
                assert same == (h >= cure.K), (n, h)
        else:
            assert torch.equal(p, before[n]), n
    for p, st in run.optimizer.state.items():  # the optimizer state is kept as it was
        for k, v in opt_before[id(p)].items():
            assert torch.equal(st[k], v)


def test_critical_w_and_verdict_rules_on_planted_outcomes():
    scan = pd.DataFrame({"w": [0, 300, 1000, 3000], "ignited": [6, 4, 0, 0]})
    assert cure.critical_w(scan) == 1000
    assert cure.critical_w(scan.assign(ignited=[6, 6, 1, 2])) is None
    v = cure.cure_verdicts({"qk": (6, 6), "ov": (0, 6)}, 1000).set_index("claim").verdict.tolist()
    assert v == ["reproduced", "reproduced", "reproduced"]
    v = cure.cure_verdicts({"qk": (2, 6), "ov": (5, 6)}, 1000).verdict.tolist()
    assert v == ["reproduced", "not reproduced", "not reproduced"]
    v = cure.cure_verdicts({"qk": (4, 6), "ov": (3, 6)}, 1000).verdict.tolist()
    assert v == ["reproduced", "partly", "partly"]
    v = cure.cure_verdicts({"qk": (6, 6), "ov": (6, 6)}, None).verdict.tolist()
    assert v == ["not reproduced", "not testable", "not testable"]
    row = cure.cure_verdicts({"qk": (0, 6), "ov": (0, 6)}, 1000).iloc[2]
    assert row.ours.startswith("0/6 [0.00, 0.46]")


def test_cure_figure_bars_are_the_counts_without_a_duplicate_bar():
    scan = pd.DataFrame({"w": [0, 1000], "seeds": [6, 6], "ignited": [6, 0]})
    arms = pd.DataFrame({"w": [1000] * 3, "arm": ["no re-init", "QK re-init", "OV re-init"],
                         "seeds": [6, 6, 6], "ignited": [0, 6, 1]})
    bar = cure.cure_figure(scan, arms).data[0]
    assert list(bar.x) == ["W=0", "W=1000", "W=1000 + QK re-init", "W=1000 + OV re-init"]
    assert list(bar.y) == [6, 0, 6, 1] and list(bar.text) == ["6/6", "0/6", "6/6", "1/6"]


def test_damage_reads_a_planted_inert_qk_and_an_unused_head():
    assert cure.uniform_causal_entropy(4) == pytest.approx((0 + 0.6931472 + 1.0986123 + 1.3862944) / 4)
    run = new_run(cure.withheld_config(0, 10, 10))
    with torch.no_grad():
        attn = run.model.blocks[0].attn
        attn.W_Q.zero_(), attn.W_K.zero_()  # planted: QK scores are 0 -> uniform causal attention
        attn.W_O[: cure.K].zero_()  # planted: the parts write nothing -> ablating them costs nothing
    d = cure.damage(run)
    assert d["entropy_gap_parts"] == pytest.approx(0, abs=1e-5) and d["entropy_gap_spares"] == pytest.approx(0, abs=1e-5)
    assert d["base_loss_parts_ablated"] == pytest.approx(d["base_loss"], abs=1e-6)


def test_scan_table_has_delay_intervals_and_damage_medians():
    wdf = pd.DataFrame({"w": [0, 0, 0, 1000, 1000, 1000], "seed": [0, 1, 2, 0, 1, 2],
                        "status": ["ignited", "ignited", "ignited", "ignited", "censored", "failed"],
                        "delay": [100.0, 100.0, 100.0, 300.0, None, None]})
    dmg = pd.DataFrame({"w": [0, 0, 0, 1000, 1000], "seed": [0, 1, 2, 0, 1],
                        **{c: [1.0, 2.0, 9.0, 4.0, 6.0] for c in cure.DAMAGE_COLUMNS}})
    t = cure.scan_table(wdf, dmg).set_index("w")
    assert t.seeds.tolist() == [3, 2] and t.ignited.tolist() == [3, 1]  # the failed job is not a seed
    assert (t.delay_median[0], t.delay_lo[0], t.delay_hi[0]) == (100.0, 100.0, 100.0)  # constant: no spread
    assert t.delay_median[1000] == 300.0
    for c in cure.DAMAGE_COLUMNS:
        assert t[c].tolist() == [2.0, 5.0]  # medians over seeds
    fig = cure.cure_figure(t.reset_index(), pd.DataFrame(columns=["w", "arm", "seeds", "ignited"]))
    assert len(fig.data) == 1 + 1 + 3 and list(fig.data[1].y) == [100.0, 300.0]
    empty = cure.scan_table(wdf.assign(status="censored", delay=None)).set_index("w")
    assert empty.ignited.tolist() == [0, 0] and np.isnan(empty.delay_median).all()


def test_damage_rows_fall_back_to_the_persisted_table(tmp_path):
    """Run folders are not committed: a finished withheld job whose folder is gone takes its damage row
    from cure_damage.csv, and with neither the call fails in one line instead of inventing numbers."""
    import pandas as pd

    from studies.alignment.cure import _damage_rows

    csv = tmp_path / "cure_damage.csv"
    pd.DataFrame([{"w": 300, "seed": 1, "ignited": True, "base_loss": 0.25},
                  {"w": 300, "seed": 2, "ignited": False, "base_loss": 0.5}]).to_csv(csv, index=False)
    gone = str(tmp_path / "runs" / "withheld-gone")
    rows = _damage_rows([{"w": 300, "seed": 2, "status": "censored", "run_dir": gone}], csv)
    assert rows == [{"w": 300, "seed": 2, "ignited": False, "base_loss": 0.5}]
    with pytest.raises(FileNotFoundError, match="w=600 seed=2"):
        _damage_rows([{"w": 600, "seed": 2, "status": "censored", "run_dir": gone}], csv)
    with pytest.raises(FileNotFoundError, match="has no row"):
        _damage_rows([{"w": 300, "seed": 2, "status": "censored", "run_dir": gone}], tmp_path / "absent.csv")


def test_unpinned_withheld_job_records_the_validation_curve_and_the_cure_redraws_every_head(tmp_path):
    """Version 2: a tiny withheld run on the unpinned preset (30 base-only steps, budget 20) records its
    validation-loss curve and smoothness, and checkpoints the switch; the QK cure continues from there."""
    import torch

    from circuitfade.io import read_json
    from circuitfade.train import RunConfig, load_checkpoint, new_run
    from studies.alignment import apparatus, withheld

    torch.set_num_threads(1)
    spec = {"kind": "withheld", "apparatus": "unpinned", "k": 3, "seed": 0, "w": 30, "budget": 20, "share": 0.5}
    r = withheld.withheld_job(spec, str(tmp_path))
    assert r["status"] == "censored" and r["final_step"] == 50
    steps, loss = r["val_curve"]
    assert steps == [0, 25, 30] and loss[0] > loss[-1] and r["smoothness"] >= 1.0
    src = tmp_path / "runs" / apparatus.job_key(spec)
    run = new_run(RunConfig.from_dict(read_json(src / "config.json")))
    assert run.config.model["priors"] == []  # the unpinned preset
    load_checkpoint(run, src, 30)
    assert run.step == 30 and run.model.cfg.n_heads == 5  # K + 2 heads, every one a candidate
    c = withheld.cure_job({"kind": "cure", "apparatus": "unpinned", "k": 3, "seed": 0, "w": 30, "which": "qk",
                           "budget": 20, "share": 0.5, "source": spec}, str(tmp_path))
    assert c["status"] == "censored" and c["final_step"] == 50 and c["acc_after_reinit"] < 0.6


def test_pinned_cure_job_starts_from_the_switch_checkpoint_and_redraws_only_the_parts(tmp_path, monkeypatch):
    """Version 1's cure job: from the withheld run's checkpoint at W, re-draw, then train to W + budget."""
    from studies.alignment import apparatus

    torch.set_num_threads(1)
    monkeypatch.setattr(cure, "BUDGET", 20)
    spec = {"kind": "withheld", "k": cure.K, "seed": 0, "w": 30}
    r = cure.withheld_job(spec, str(tmp_path))
    assert r["status"] == "censored" and r["final_step"] == 50
    run, _ = apparatus.from_source({**spec, "source": spec}, str(tmp_path))
    assert run.step == 30 and run.metrics == [m for m in run.metrics if m["step"] <= 30]
    c = cure.cure_job({"kind": "cure", "k": cure.K, "seed": 0, "w": 30, "which": "qk", "source": spec}, str(tmp_path))
    assert c["status"] == "censored" and c["final_step"] == 50 and c["delay"] is None and c["cpu_s"] > 0
    assert 0.0 <= c["acc_after_reinit"] <= 1.0 and min(c["curve"][0]) >= 30
