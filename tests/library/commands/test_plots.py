"""Tests for circuitfade.viz.plots (figure structure on planted traces), circuitfade.viz.export (saving) and
circuitfade.commands.analyze (the analyze pipeline and its report).

The figure tests build tidy traces by hand, with a planted crossing: head L1H2's
successor mass is .10, .30, .60 at steps 0, 100, 200 and L0H1's .05, .20, .40, every
other head stays below .1, so with threshold .25 L1H2 crosses first (step 100) and
L0H1 at step 200.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from circuitfade import compat
from circuitfade.commands.analyze import analyze, analyze_main
from circuitfade.tasks import make_task
from circuitfade.train import RunConfig, TrainConfig, train
from circuitfade.viz import export, plots
from circuitfade.viz.tables import markdown_table

torch.set_num_threads(1)

STEPS = [0, 100, 200]
N_LAYERS, N_HEADS = 2, 4
PLANTED = {(1, 2): [0.10, 0.30, 0.60], (0, 1): [0.05, 0.20, 0.40]}
MASS = "successor_mass"


def planted_trace(planted=PLANTED, metric: str = MASS, run: str = "r0") -> pd.DataFrame:
    rows = []
    for i, s in enumerate(STEPS):
        for l in range(N_LAYERS):
            for h in range(N_HEADS):
                v = planted[(l, h)][i] if (l, h) in planted else 0.01 * (l * N_HEADS + h)
                rows.append({"step": s, "layer": l, "head": h, "metric": metric, "value": v, "note": None, "run": run})
    df = pd.DataFrame(rows)
    df["layer"] = df["layer"].astype("Int64")
    df["head"] = df["head"].astype("Int64")
    return df


def title(axis) -> str:
    return axis.title.text


# --------------------------------------------------------------------------- heatmap
def test_heatmap_slider_has_one_trace_and_one_step_per_checkpoint():
    fig = plots.head_heatmap(planted_trace(), MASS)
    assert len(fig.data) == 3
    assert [tr.name for tr in fig.data] == ["step 0", "step 100", "step 200"]
    assert [tr.visible for tr in fig.data] == [False, False, True]  # starts at the last step
    (slider,) = fig.layout.sliders
    assert [st.label for st in slider.steps] == ["0", "100", "200"]
    assert slider.active == 2
    assert list(slider.steps[1].args[0]["visible"]) == [False, True, False]
    z = np.asarray(fig.data[1].z)
    assert z.shape == (N_LAYERS, N_HEADS)
    assert z[1, 2] == pytest.approx(0.30)
    assert fig.data[1].text[1][2] == "L1H2 step 100: 0.3"
    # one colour scale for every step, spanning all values
    assert fig.layout.coloraxis.cmin == pytest.approx(0.0)
    assert fig.layout.coloraxis.cmax == pytest.approx(0.60)
    assert all(tr.coloraxis == "coloraxis" for tr in fig.data)
    assert fig.layout.coloraxis.colorbar.title.text.replace("<br>", " ") == plots.metric_label(MASS)
    assert fig.layout.coloraxis.colorbar.title.side == "right"
    assert "attention probability" in fig.layout.coloraxis.colorbar.title.text.replace("<br>", " ")
    # wrapped into short lines, so the rotated title fits beside the bar instead of being clipped
    assert all(len(line) <= 26 for line in fig.layout.coloraxis.colorbar.title.text.split("<br>"))
    assert title(fig.layout.xaxis) == "head" and title(fig.layout.yaxis) == "layer"


def test_heatmap_at_one_step_and_bad_input():
    fig = plots.head_heatmap(planted_trace(), MASS, step=100)
    assert len(fig.data) == 1 and not fig.layout.sliders
    assert np.asarray(fig.data[0].z)[0, 1] == pytest.approx(0.20)
    with pytest.raises(ValueError, match=r"step 50 .*\[0, 100, 200\]"):
        plots.head_heatmap(planted_trace(), MASS, step=50)
    with pytest.raises(ValueError, match="not in the trace; metrics: \\['successor_mass'\\]"):
        plots.head_heatmap(planted_trace(), "ablation_importance")
    two_runs = pd.concat([planted_trace(run="a"), planted_trace(run="b")])
    with pytest.raises(ValueError, match="filter it to one"):
        plots.head_heatmap(two_runs, MASS)
    with pytest.raises(ValueError, match="missing \\['value'\\]"):
        plots.head_heatmap(planted_trace().drop(columns="value"), MASS)


def test_small_multiples_one_panel_per_checkpoint_shared_scale():
    fig = plots.head_small_multiples(planted_trace(), MASS, max_cols=2)
    assert len(fig.data) == 3
    assert [a.text for a in fig.layout.annotations] == ["step 0", "step 100", "step 200"]
    assert {tr.coloraxis for tr in fig.data} == {"coloraxis"}
    assert fig.layout.coloraxis.cmax == pytest.approx(0.60)
    assert fig.data[2].xaxis == "x3"  # 2 columns: step 200 opens the second row
    assert title(fig.layout.xaxis3) == "head" and title(fig.layout.xaxis2) == "head"  # lowest panel of each column
    assert title(fig.layout.yaxis) == "layer" and title(fig.layout.yaxis3) == "layer"
    assert fig.data[0].text[0][1] == "L0H1 step 0: 0.05"
    with pytest.raises(ValueError, match="max_cols"):
        plots.head_small_multiples(planted_trace(), MASS, max_cols=0)


# -------------------------------------------------------------------------- timeline
def test_timeline_marks_first_crossings_at_the_planted_steps():
    gate = lambda s: 0.5 if s < 50 else max(0.0, 0.5 - (s - 50) / 100)  # noqa: E731
    fig = plots.head_timeline(planted_trace(), MASS, gate=gate, threshold=0.25, gate_zero_step=100)
    names = [tr.name for tr in fig.data]
    heads = [f"L{l}H{h}" for l in range(N_LAYERS) for h in range(N_HEADS)]
    assert names == heads + ["first crossing (≥ 0.25)", "threshold 0.25", "gate (schedule)"]
    # the top head at the last step (L1H2) is drawn above the others, and wider
    top = fig.data[names.index("L1H2")]
    assert top.zorder == 1 and top.line.width > fig.data[0].line.width
    # the threshold is named in the legend, and the only text label is the crossing's (no overlap)
    assert [a.text for a in fig.layout.annotations if "threshold" in a.text] == []
    line = fig.data[names.index("L1H2")]
    assert list(line.x) == STEPS and list(line.y) == pytest.approx(PLANTED[(1, 2)])
    assert "L1H2 step 100: 0.3" in line.text
    cross = fig.data[names.index("first crossing (≥ 0.25)")]
    at = {t.split()[0]: (x, y) for t, x, y in zip(cross.text, cross.x, cross.y)}
    assert at == {"L0H1": (200, pytest.approx(0.40)), "L1H2": (100, pytest.approx(0.30))}
    # the series' first crossing is annotated (= timeline_long first_step / first_head)
    (note,) = [a for a in fig.layout.annotations if a.showarrow]
    assert note.x == 100 and "L1H2" in note.text
    # the gate on the secondary axis, sampled from the callable
    g = fig.data[-1]
    assert g.yaxis == "y2" and title(fig.layout.yaxis2).startswith("gate value")
    assert all(y == pytest.approx(gate(x)) for x, y in zip(g.x, g.y))
    assert g.x[0] == 0 and g.x[-1] == 200
    assert title(fig.layout.xaxis) == "training step"
    assert title(fig.layout.yaxis) == plots.metric_label(MASS)
    ys = {sh.y0 for sh in fig.layout.shapes if sh.yref == "y"}
    xs = {sh.x0 for sh in fig.layout.shapes if sh.xref == "x"}
    assert ys == {0.25} and xs == {100}


def test_timeline_top_k_keeps_the_first_crossing_head():
    # L0H1 ends highest, but L1H2 crosses first: both are kept with top_k=1
    planted = {(1, 2): [0.10, 0.30, 0.35], (0, 1): [0.05, 0.20, 0.90]}
    fig = plots.head_timeline(planted_trace(planted), MASS, threshold=0.25, top_k=1)
    assert [tr.name for tr in fig.data] == ["L0H1", "L1H2", "first crossing (≥ 0.25)", "threshold 0.25"]
    fig = plots.head_timeline(planted_trace(planted), MASS, top_k=1)
    assert [tr.name for tr in fig.data] == ["L0H1"] and not fig.layout.shapes
    with pytest.raises(ValueError, match="top_k"):
        plots.head_timeline(planted_trace(), MASS, top_k=0)


def test_timeline_gate_from_metrics_columns():
    gates = pd.DataFrame({"step": STEPS, "gate_pos": [0.5, 0.25, 0.0], "gate_content": [0.5, 0.5, 0.5]})
    fig = plots.head_timeline(planted_trace(), MASS, gate=gates)
    assert [tr.name for tr in fig.data][-2:] == ["gate (pos)", "gate (content)"]
    assert list(fig.data[-2].y) == [0.5, 0.25, 0.0] and fig.data[-2].yaxis == "y2"
    with pytest.raises(ValueError, match="'step' column and a 'gate'"):
        plots.head_timeline(planted_trace(), MASS, gate=pd.DataFrame({"step": STEPS}))
    with pytest.raises(ValueError, match="callable"):
        plots.head_timeline(planted_trace(), MASS, gate=0.5)


# ---------------------------------------------------------------- bars and curves
def test_gate_intervention_bar():
    table = pd.DataFrame({
        "condition": ["normal", "position gate zeroed", "content gate zeroed", "both gates zeroed"],
        "gates": ["as trained", "pos=0", "content=0", "pos=0, content=0"],
        "accuracy": [0.9, 0.8, 0.3, 0.1], "loss": [0.2, 0.4, 1.9, 2.7],
    })
    fig = plots.gate_intervention_bar(table, chance=1 / 16)
    (bar,) = fig.data
    assert list(bar.x) == list(table["condition"]) and list(bar.y) == [0.9, 0.8, 0.3, 0.1]
    assert bar.hovertext[2] == "content gate zeroed (content=0): accuracy 0.3, loss 1.9 nats"
    assert [sh.y0 for sh in fig.layout.shapes] == [pytest.approx(1 / 16)]
    assert title(fig.layout.yaxis) == "accuracy (fraction correct)"
    assert title(fig.layout.xaxis) == "gate condition at evaluation"
    assert not plots.gate_intervention_bar(table).layout.shapes
    with pytest.raises(ValueError, match="missing \\['accuracy'\\]"):
        plots.gate_intervention_bar(table.drop(columns="accuracy"))


def test_training_curves_accuracy_and_gates():
    m = pd.DataFrame({"step": [0, 10, 20], "gate_pos": [0.5, 0.25, 0.0], "gate_content": [0.5, 0.25, 0.0],
                      "train_loss": [np.nan, 3.0, 2.0], "acc_normal": [0.1, 0.5, 0.9],
                      "loss_normal": [3.4, 2.0, 0.5], "acc_zero": [0.1, 0.2, 0.9]})
    fig = plots.training_curves(m)
    # the two gates are identical at every step: drawn once, and the legend says so
    assert [tr.name for tr in fig.data] == ["normal (gates as set)", "zero gate", "gate (pos = content)"]
    assert list(fig.data[1].y) == [0.1, 0.2, 0.9]
    assert [tr.yaxis or "y" for tr in fig.data] == ["y", "y", "y2"]
    assert list(fig.layout.yaxis2.tickvals) == [0, 0.25, 0.5, 0.75, 1]  # nice gate ticks, not synced ones
    assert title(fig.layout.yaxis) == "accuracy (fraction correct)"
    assert title(fig.layout.yaxis2).startswith("gate value") and title(fig.layout.xaxis) == "training step"
    reg = plots.training_curves(pd.DataFrame({"step": [0, 10], "mse_normal": [1.0, 0.5]}))
    assert title(reg.layout.yaxis) == "mean squared error" and len(reg.data) == 1
    with pytest.raises(ValueError, match="acc_<condition>"):
        plots.training_curves(pd.DataFrame({"step": [0]}))


def test_write_html_embeds_plotly_js(tmp_path):
    f = tmp_path / "fig.html"
    plots.head_heatmap(planted_trace(), MASS).write_html(f)
    text = f.read_text()
    assert re.search(r"plotly\.js v\d", text) and "<script src=" not in text  # inline: works offline
    assert "L1H2 step 200: 0.6" in text


def test_markdown_table():
    df = pd.DataFrame({"head": pd.array(["L1H2", pd.NA], dtype="string"), "step": pd.array([100, pd.NA], dtype="Int64"),
                       "value": [0.123456, float("nan")]})
    assert markdown_table(df) == "| head | step | value |\n|---|---|---|\n| L1H2 | 100 | 0.1235 |\n| NA | NA | NA |"


# ------------------------------------------------------------------------- analyze
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "fade"
    cfg = RunConfig(path="fade5+5->0", train=TrainConfig(steps=20, checkpoint_every=10, eval_every=10, eval_size=64))
    train(cfg, run_dir, progress=False)
    return run_dir


def test_analyze_run_dir_writes_report(tiny_run, tmp_path):
    out = tmp_path / "report.html"
    res = analyze(tiny_run, out, n=32, progress=False)
    assert res["series"].steps == [0, 10, 20]
    tl = res["timeline"]
    assert len(tl) == 1 and tl["path"].iloc[0] == "fade5+5->0"
    assert tl["gate_zero_step"].iloc[0] == 10  # 0.5 until step 5, linear to 0 at step 10
    traced = res["traced"]
    assert set(traced["metric"]) == {"successor_mass", "ablation_importance", "ablation_loss_increase"}
    assert len(traced) == 3 * 3 * 2 * 4 and traced["value"].notna().all()  # steps x metrics x layers x heads
    assert list(res["interventions"]["condition"]) == [
        "normal", "position gate zeroed", "content gate zeroed", "both gates zeroed"]
    assert list(res["figures"]) == ["successor_mass_heatmap", "successor_mass_timeline", "ablation_importance_heatmap",
                                    "ablation_importance_timeline", "gate_interventions", "training_curves"]
    # the timeline figure annotates the crossing the table reports
    for metric in ("successor_mass", "ablation_importance"):
        arrows = [a for a in res["figures"][f"{metric}_timeline"].layout.annotations if a.showarrow]
        first = tl[f"{metric}_first_step"].iloc[0]
        if pd.isna(first):
            assert not arrows
        else:
            assert arrows[0].x == first and tl[f"{metric}_first_head"].iloc[0] in arrows[0].text
    assert res["html"] == out
    text = out.read_text()
    assert len(re.findall(r"plotly\.js v\d", text)) == 1 and "<script src=" not in text
    assert text.count('class="plotly-graph-div"') == 6
    assert "Consolidation timeline" in text and "both gates zeroed" in text


def test_analyze_main_prints_timeline(tiny_run, tmp_path, capsys):
    out = tmp_path / "a.html"
    assert analyze_main([str(tiny_run), "--out", str(out), "--n", "32", "--every", "20", "--quiet"]) == 0
    printed = capsys.readouterr().out
    # the one-row timeline is printed transposed: one line per column
    assert "| column | value |" in printed and "| path | fade5+5->0 |" in printed and "| run | fade |" in printed
    assert "| run | path | seed |" not in printed and "2 checkpoints (steps 0..20)" in printed
    assert re.search(r"^\| successor_mass_top_head \| L\dH\d \|$", printed, re.M)
    assert "| 20 | both gates zeroed |" in printed and out.is_file()
    assert analyze_main([str(tiny_run / "nope"), "--quiet"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_analyze_plain_models_without_gates(tmp_path):
    cfg = dict(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=32, attn_only=True, act_fn=None, seed=0)
    models = [compat.plain_model(cfg), compat.plain_model(cfg)]
    task = make_task("assoc")
    with pytest.raises(ValueError, match="pass task="):
        analyze(models, progress=False)
    res = analyze(models, tmp_path / "ht.html", n=32, task=task, progress=False)
    assert res["interventions"] is None and res["metrics"] is None
    assert any("no gates" in note for note in res["notes"])
    assert "gate_interventions" not in res["figures"] and "training_curves" not in res["figures"]
    assert len(res["timeline"]) == 1 and pd.isna(res["timeline"]["gate_zero_step"].iloc[0])
    assert res["traced"]["value"].notna().all() and len(res["traced"]) == 2 * 3 * 2
    assert not any(tr.name and tr.name.startswith("gate") for tr in res["figures"]["successor_mass_timeline"].data)
    assert (tmp_path / "ht.html").is_file()


# ------------------------------------------------------------------------- saving
def test_save_html_always_and_unknown_suffix(tmp_path):
    fig = plots.head_heatmap(planted_trace(), MASS)
    out = plots.save(fig, tmp_path / "sub" / "fig.html")
    text = out.read_text()
    assert "plotly.js" in text and "L1H2 step 200: 0.6" in text
    assert "cdn.plot.ly" in plots.save(fig, tmp_path / "cdn.html", plotlyjs="cdn").read_text()
    with pytest.raises(ValueError, match="unknown figure format '.gif'"):
        plots.save(fig, tmp_path / "fig.gif")
    with pytest.raises(ValueError, match="go.Figure"):
        plots.save({"data": []}, tmp_path / "x.html")


def test_save_without_exporter_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setitem(export._EXPORTER, "result", (None, "kaleido 0.2: ModuleNotFoundError"))
    with pytest.raises(export.ExportError, match=r"pip install 'circuitfade\[figures\]'"):
        plots.save(plots.head_heatmap(planted_trace(), MASS), tmp_path / "fig.png")
    assert not (tmp_path / "fig.png").exists()


def test_save_png_svg_pdf(tmp_path):
    """Real image export (CI installs the [figures] extra through [dev]; skipped only where the
    exporter package is not installed at all - a broken install fails)."""
    pytest.importorskip("kaleido", reason="pip install 'circuitfade[figures]' for image export")
    exporter, why = export.image_exporter()
    assert exporter is not None, why
    fig = plots.head_timeline(planted_trace(), MASS, threshold=0.25)
    png = plots.save(fig, tmp_path / "t.png", width=500, height=300).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (w, h) == (500, 300)
    assert (w, h) != (0, 0) and len(png) > 5000  # not an empty canvas
    assert plots.save(fig, tmp_path / "t.svg").read_text().lstrip().startswith("<svg")
    assert plots.save(fig, tmp_path / "t.pdf").read_bytes()[:5] == b"%PDF-"


# ----------------------------------------------------------- intervals (optional columns)
def test_timeline_and_bars_draw_intervals_when_present():
    tr = planted_trace()
    assert plots.head_timeline(tr, MASS).data[0].error_y.array is None  # none without interval columns
    tr = tr.assign(lo=tr["value"] - 0.02, hi=tr["value"] + 0.05)
    line = plots.head_timeline(tr, MASS).data[6]  # L1H2
    assert list(line.error_y.array) == pytest.approx([0.05] * 3)
    assert list(line.error_y.arrayminus) == pytest.approx([0.02] * 3)
    table = pd.DataFrame({"condition": ["a", "b"], "accuracy": [0.5, 0.8], "se": [0.01, 0.02]})
    (bar,) = plots.gate_intervention_bar(table).data
    assert list(bar.error_y.array) == pytest.approx([0.0196, 0.0392])


def test_training_curves_draw_identical_conditions_once():
    m = pd.DataFrame({"step": [0, 10, 20], "acc_normal": [0.1, 0.5, 0.9], "acc_zero": [0.1, 0.2, 0.3],
                      "acc_param": [0.1, 0.5, 0.9], "acc_half": [0.1, 0.2, 0.3001]})
    names = [tr.name for tr in plots.training_curves(m).data]
    assert names == ["normal (gates as set) = gate = sigmoid(logit) (identical)", "zero gate", "gate = 0.5"]


def test_gate_axis_ticks_at_nice_values_and_legend_clear_of_it():
    gates = pd.DataFrame({"step": STEPS, "gate_pos": [0.53, 0.21, 0.03]})
    fig = plots.head_timeline(planted_trace(), MASS, gate=gates)
    assert list(fig.layout.yaxis2.tickvals) == [0, 0.25, 0.5, 0.75, 1]
    assert fig.layout.legend.x >= 1.08  # right of the gate axis title


def test_chance_label_sits_in_the_margin_not_on_a_bar():
    table = pd.DataFrame({"condition": ["a", "b"], "accuracy": [0.5, 0.1]})
    fig = plots.gate_intervention_bar(table, chance=0.1)
    (note,) = fig.layout.annotations
    assert note.xref == "paper" and note.x > 1 and note.xanchor == "left"


def test_class_count_figure_counts_heads():
    fr = pd.DataFrame({"step": [0, 10, 0, 10], "class": ["induction", "induction", "bos", "bos"],
                       "count": [0, 3, 1, 2], "n_heads": [8, 8, 8, 8], "fraction": [0, 3 / 8, 1 / 8, 2 / 8]})
    fig = plots.class_count_figure(fr, pd.DataFrame({"class": ["induction"], "shape": ["sharp"]}))
    assert [tr.name for tr in fig.data] == ["induction (sharp)", "bos"]
    assert list(fig.data[0].y) == [0, 3] and fig.data[0].text[1] == "induction, step 10: 3 of 8 heads"
    assert "of 8 heads" in fig.layout.title.text and list(fig.layout.xaxis.ticktext) == ["0", "10"]
    with pytest.raises(ValueError, match="count"):
        plots.class_count_figure(fr.drop(columns="count"))
    same = pd.concat([fr, fr[fr["class"] == "induction"].assign(**{"class": "previous_token"})], ignore_index=True)
    names = [tr.name for tr in plots.class_count_figure(same).data]
    assert names == ["induction = previous_token (identical counts)", "bos"]  # drawn once, not hidden


# ------------------------------------------------------------------- tables and pages
def test_markdown_and_html_tables():
    from circuitfade.viz.tables import html_table, markdown_table as md

    df = pd.DataFrame({"a": [1.234567, np.nan], "b|c": ["x<y", None]})
    assert md(df).splitlines() == ["| a | b\\|c |", "|---|---|", "| 1.235 | x<y |", "| NA | NA |"]
    h = html_table(df)
    assert h.startswith('<div class="table-wrap">') and "x&lt;y" in h and "<th>b|c</th>" in h
    wide = pd.DataFrame([{f"col{i}": i for i in range(14)}])
    t = html_table(wide, transpose=True)
    assert t.count("<tr>") == 14 and "<tr><th>col13</th><td>13</td></tr>" in t


def test_page_builder_orders_sections_and_embeds_plotly_once(tmp_path):
    from circuitfade.viz.html import Note, Raw, Section, Table, page, write_page

    figs = [plots.head_heatmap(planted_trace(), MASS), plots.head_timeline(planted_trace(), MASS)]
    text = page("T <1>", [Section("Figures", figs), ("Tables", [pd.DataFrame({"x": [1]}), Note("n & m"),
                                                               Table(pd.DataFrame({"y": [2]}), transpose=True),
                                                               Raw("<b>raw</b>"), "plain"])], intro="hello")
    assert text.count("<h1>T &lt;1&gt;</h1>") == 1 and "<p>hello</p>" in text
    assert text.index("<h2>Figures</h2>") < text.index('class="figure"') < text.index("<h2>Tables</h2>")
    assert text.count("plotly.js v") == 1  # embedded once
    assert '<p class="note">n &amp; m</p>' in text and "<b>raw</b>" in text and "<p>plain</p>" in text
    assert "overflow-x: auto" in text
    out = write_page(tmp_path / "r" / "p.html", "t", [Section("s", ["x"])], plotlyjs="cdn")
    assert out.read_text().endswith("</body></html>")
    with pytest.raises(ValueError, match="page item"):
        page("t", [Section("s", [object()])])


# ------------------------------------------------------------------ attention patterns
def _uniform_attention_model(seed: int):
    """A tiny model whose queries are zero: every score is equal, so attention is uniform over
    the causal window (pattern[q, k] = 1 / (q + 1) for k <= q) - a planted, known answer."""
    m = compat.plain_model(dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=8, d_vocab=10,
                                attn_only=True, seed=seed))
    with torch.no_grad():
        for block in m.blocks:
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    return m


def test_attention_patterns_and_figure_on_planted_uniform_attention():
    from circuitfade.analysis.attention import attention_series
    from circuitfade.viz.attention import attention_figure, attention_view

    models = {0: _uniform_attention_model(0), 50: _uniform_attention_model(1)}
    tokens = torch.tensor([3, 1, 4, 1, 5])
    p = attention_series(models, tokens, token_labels=list("abcbd"))
    assert p.patterns.shape == (2, 2, 2, 5, 5) and p.steps == (0, 50)
    want = np.tril(np.ones((5, 5))) / np.arange(1, 6)[:, None]
    np.testing.assert_allclose(p.patterns[1, 1, 0], want, atol=1e-6)
    assert p.labels == ("0:a", "1:b", "2:c", "3:b", "4:d")  # repeated tokens stay distinct
    fig = attention_figure(p, layer=1)
    assert len(fig.data) == 4 and [tr.visible for tr in fig.data] == [False, False, True, True]
    (slider,) = fig.layout.sliders
    assert [s.label for s in slider.steps] == ["0", "50"]
    assert list(slider.steps[0].args[0]["visible"]) == [True, True, False, False]
    assert list(fig.layout.xaxis.ticktext) == list(p.labels) and fig.layout.yaxis.autorange == "reversed"
    assert "L1H0 step 50: query 3:b -> key 1:b: 0.250" in fig.data[2].text[3][1]
    assert isinstance(attention_view(p, 1, backend="plotly"), type(fig))
    with pytest.raises(ValueError, match="layer"):
        attention_figure(p, layer=2)
    with pytest.raises(ValueError, match="steps \\[7\\]"):
        attention_series(models, tokens, steps=[7])
    with pytest.raises(ValueError, match="n_ctx = 8"):
        attention_series(models, torch.arange(9))


def test_attention_view_uses_circuitsvis_when_installed(monkeypatch):
    import sys
    import types

    from circuitfade.analysis.attention import attention_series
    from circuitfade.viz.attention import CircuitsVisSeries, attention_view

    calls = []
    fake = types.ModuleType("circuitsvis.attention")
    fake.attention_patterns = lambda tokens, attention: calls.append((tokens, tuple(attention.shape))) or "<cv/>"
    pkg = types.ModuleType("circuitsvis")
    pkg.attention = fake
    monkeypatch.setitem(sys.modules, "circuitsvis", pkg)
    monkeypatch.setitem(sys.modules, "circuitsvis.attention", fake)
    p = attention_series([_uniform_attention_model(0)] * 3, torch.tensor([1, 2, 3]))
    view = attention_view(p, 0)
    assert isinstance(view, CircuitsVisSeries) and len(calls) == 3
    assert calls[0] == (["0:1", "1:2", "2:3"], (2, 3, 3))  # [head, query, key] per step
    assert view._repr_html_().count("<cv/>") == 3 and 'type="range"' in view.html
    monkeypatch.setitem(sys.modules, "circuitsvis", None)
    monkeypatch.setitem(sys.modules, "circuitsvis.attention", None)
    assert not isinstance(attention_view(p, 0), CircuitsVisSeries)  # plotly without it
    with pytest.raises(ImportError, match="pip install circuitsvis"):
        attention_view(p, 0, backend="circuitsvis")


def test_save_with_timeout_exports_in_a_child_and_reports_a_hang(tmp_path, monkeypatch):
    fig = go.Figure(go.Bar(y=[1, 2, 3]))
    out = plots.save(fig, tmp_path / "child.png", width=300, height=200, timeout=120)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a child that never finishes is killed and reported, not waited for ...
    monkeypatch.setattr(export, "_CHILD_EXPORT", "while True: pass\n")
    with pytest.raises(export.ExportError, match=r"did not finish within 0.2 s \(2 tries\)"):
        plots.save(fig, tmp_path / "hang.png", timeout=0.2, retries=1)
    with pytest.raises(export.ExportError, match=r"did not finish within 0.2 s$"):
        plots.save(fig, tmp_path / "hang.png", timeout=0.2, retries=0)
    # ... and a hang that a fresh child does not repeat costs one try, not the figure
    once = ("import os, sys\nmark = sys.argv[1] + '.tried'\nif not os.path.exists(mark):\n"
            "    open(mark, 'w').close()\n    while True: pass\n"
            "open(sys.argv[2], 'wb').write(b'\\x89PNG planted')\n")
    monkeypatch.setattr(export, "_CHILD_EXPORT", once)
    assert plots.save(fig, tmp_path / "second.png", timeout=0.5).read_bytes() == b"\x89PNG planted"
    for bad in ({"timeout": 0}, {"timeout": 1, "retries": -1}, {"timeout": 1, "retries": 1.5}):
        with pytest.raises(ValueError, match="timeout must be > 0 s and retries a whole number"):
            plots.save(fig, tmp_path / "bad.png", **bad)
    # ... also when it started a process of its own that escapes the kill and keeps stderr open
    # (it outlives the kill by 30 s, then exits; waiting on its pipe would take those 30 s)
    grandchild = "import os, time\\np = os.getppid()\\nwhile os.getppid() == p: time.sleep(0.05)\\ntime.sleep(30)"
    escape = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', '{grandchild}'], start_new_session=True)\n"
              "while True: pass\n")
    monkeypatch.setattr(export, "_CHILD_EXPORT", escape)
    t0 = time.monotonic()
    with pytest.raises(export.ExportError, match="did not finish within 1 s"):
        plots.save(fig, tmp_path / "escaped.png", timeout=1, retries=0)
    assert time.monotonic() - t0 < 20  # margin for a loaded machine
    monkeypatch.setattr(export, "_CHILD_EXPORT", "raise SystemExit('no browser here')\n")
    with pytest.raises(export.ExportError, match="no browser here"):
        plots.save(fig, tmp_path / "broken.png", timeout=60)
    assert not (tmp_path / "hang.png").exists()


def test_an_export_in_this_process_whose_browser_hangs_is_killed_and_tried_again():
    """kaleido 0.2 reads its browser's answer from a pipe that a shell script and the browser below it
    hold open; a hung answer is ended by killing that whole tree, then the export is tried again."""
    import subprocess
    import sys

    held = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\ntime.sleep(60)"
    state = {"proc": None, "calls": 0}

    def call():
        state["calls"] += 1
        if state["calls"] == 1:  # the first answer never comes: a read blocked on a pipe a grandchild holds
            state["proc"] = subprocess.Popen([sys.executable, "-c", held], stdout=subprocess.PIPE)
            if not state["proc"].stdout.readline():
                raise ValueError("Transform failed")  # what kaleido raises when the pipe closes
        return b"image"

    t0 = time.monotonic()
    assert export._unless_hung(call, lambda: state["proc"], 1.0, 2) == b"image" and state["calls"] == 2
    assert time.monotonic() - t0 < 30  # not the 60 s the processes would have held the pipe
    assert state["proc"].wait(timeout=10) == -9
    # every try hangs: one error naming the wait; an error of the call itself is raised at once
    with pytest.raises(export.ExportError, match="did not answer within 0.2 s, 2 times"):
        export._unless_hung(lambda: time.sleep(0.5) or (_ for _ in ()).throw(ValueError("x")), lambda: None, 0.2, 2)
    with pytest.raises(ValueError, match="bad figure"):
        export._unless_hung(lambda: (_ for _ in ()).throw(ValueError("bad figure")), lambda: None, 5, 3)


# --------------------------------------------------------------------------------------
# notebooks: figures that survive export, no IProgress warning
# --------------------------------------------------------------------------------------
def test_renderer_in_a_kernel_embeds_figures_unless_one_was_chosen(monkeypatch):
    import plotly.io as pio

    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")  # plotly's own pick in a Jupyter kernel
    assert export.use_exportable_renderer() == export.EXPORTABLE_RENDERER == "plotly_mimetype+notebook"
    assert pio.renderers.default == "plotly_mimetype+notebook"
    # the HTML copy carries the figure itself: what nbconvert --to html keeps
    bundle = go.Figure(go.Bar(y=[4, 2]))._repr_mimebundle_()
    assert "application/vnd.plotly.v1+json" in bundle and "Plotly.newPlot" in bundle["text/html"]
    for chosen in ("svg", "browser", "vscode", "notebook_connected"):  # the user's (or the host's) choice is kept
        monkeypatch.setattr(pio.renderers, "default", chosen)
        assert export.use_exportable_renderer() is None and pio.renderers.default == chosen
    monkeypatch.setattr(pio.renderers, "default", "plotly_mimetype")
    monkeypatch.setenv("PLOTLY_RENDERER", "plotly_mimetype")  # chosen through the environment
    assert export.use_exportable_renderer() is None and pio.renderers.default == "plotly_mimetype"


# a Jupyter kernel as tqdm and plotly detect one, without ipywidgets
_FAKE_KERNEL = """
import sys, types, warnings
class ZMQInteractiveShell:
    __module__ = "ipykernel.zmqshell"
    config = {"IPKernelApp": {}}
for name in ("ipykernel", "ipykernel.zmqshell"):
    sys.modules[name] = types.ModuleType(name)
ipython = types.ModuleType("IPython")
ipython.get_ipython = ZMQInteractiveShell
sys.modules["IPython"] = ipython
sys.modules["ipywidgets"] = None  # not installed
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    import circuitfade.viz.plots
    import huggingface_hub  # what TransformerLens's dependencies import: tqdm.auto
    import tqdm.auto
import plotly.io as pio
print(pio.renderers.default)
print([str(w.message)[:40] for w in seen if "IProgress" in str(w.message)])
"""


def test_importing_circuitfade_in_a_kernel_without_ipywidgets_is_quiet_and_figures_embed():
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != "PLOTLY_RENDERER"}
    out = subprocess.run([sys.executable, "-c", _FAKE_KERNEL], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    renderer, warned = out.stdout.strip().splitlines()[-2:]
    assert renderer == "plotly_mimetype+notebook"
    assert warned == "[]", warned
    assert "IProgress" not in out.stderr


@pytest.mark.slow
def test_a_notebook_keeps_its_figures_and_shows_no_iprogress_warning(tmp_path, monkeypatch):
    """A real kernel: the first cell imports circuitfade (TransformerLens and its dependencies
    with it), the next displays a figure; the saved outputs hold the figure as HTML with
    plotly.js, and no output mentions IProgress."""
    import json
    import sys

    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "circuitfade tests", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    cells = ["import circuitfade.train\nfrom circuitfade.viz import plots",
             "import plotly.graph_objects as go\ngo.Figure(go.Bar(y=[1, 2]))"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells for o in c.outputs]
    assert not any("IProgress" in json.dumps(o) for o in outputs)
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("Plotly.newPlot" in h for h in html)  # the figure, as nbconvert --to html keeps it
    assert any("plotly.js v" in h for h in html)  # plotly.js itself, once: renders offline
