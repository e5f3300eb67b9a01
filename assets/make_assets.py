"""Regenerate the shipped example series (``circuitfade/data/series/``) and the docs figures (``assets/figures/``).

    python assets/make_assets.py                      # train (or reuse) the two runs, copy, trace, plot
    python assets/make_assets.py --wait 2400          # wait up to 40 min for a sweep already training them
    python assets/make_assets.py --figures-only       # only redraw assets/figures from the shipped series

Two full runs on associative recall, seed 0, default ``TrainConfig`` (3,600 steps,
a checkpoint every 300): ``unforced`` and ``fade600->0``. They are trained with
:func:`circuitfade.train.sweep.run_sweep` into ``--root`` (default ``results/runs``, the
sweep root of ``python -m studies.paper reproduce``), so finished runs are reused, never retrained.
With ``--wait S`` the script first waits (polling every 30 s, up to ``S`` seconds)
for another process - e.g. a running ``python -m studies.paper reproduce`` - to finish them,
and stops rather than training into a directory someone else is writing.

Each run is copied to ``circuitfade/data/series/<name>/`` (``config.json``, ``metrics.csv``,
``done.json``, ``checkpoints/step_XXXXXX.safetensors``): weights only, without the
optimizer state files, so the whole series is a few MB. ``circuitfade.store.attach``
opens such a copy like any run directory.

Figures (``assets/figures/``), traced from the *copies* with
:func:`circuitfade.analysis.head_diagnostics` at every checkpoint:

* ``fade600to0_ablation_importance_heatmap`` / ``fade600to0_successor_mass_heatmap``:
  per-head heatmaps with a step slider;
* ``fade600to0_timeline_successor_mass`` / ``fade600to0_timeline_ablation_importance``:
  the consolidation timeline (per-head lines, gate overlaid, threshold crossings);
* ``training_curves_unforced`` / ``training_curves_fade600to0``;
* ``unforced_gate_interventions``: accuracy with each gate zeroed at the final step;
* ``circuits_graph``, ``circuits_edge_heatmap``, ``circuits_faithfulness``: edge attribution
  (EAP-IG) of the fade series, the figures of the docs' "Circuits across checkpoints" page
  (``--circuit-figures-only`` redraws just these).

HTML files load plotly.js from its CDN to stay small (``--embed-plotlyjs`` embeds it,
about 4.8 MB per file); PNG versions are written when the optional ``kaleido==0.2.1``
(``pip install 'circuitfade[figures]'``, bundles its own Chromium) works, through
:func:`circuitfade.viz.plots.save`.
The consolidation timeline table is printed and saved as ``consolidation_timeline.md``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

from circuitfade.viz import export, plots
from circuitfade.analysis import consolidation_timeline, gate_intervention_table, head_diagnostics
from circuitfade.analysis.heads import ABLATION_IMPORTANCE, SUCCESSOR_MASS
from circuitfade.analysis.timeline import DEFAULT_THRESHOLDS
from circuitfade.viz.tables import markdown_table
from circuitfade.store import attach, trace
from circuitfade.train.sweep import run_dir_for, run_sweep
from circuitfade.tasks import EVAL_SEED, EVAL_SIZE, eval_set
from circuitfade.train import RunConfig, TrainConfig, read_metrics
from circuitfade.train.rundir import CKPT_DIR

ASSETS = Path(__file__).resolve().parent
SERIES = ASSETS.parent / "circuitfade" / "data" / "series"  # shipped inside the package
RUNS = {"unforced": "unforced", "fade600to0": "fade600->0"}
"""Asset name -> gate path of the shipped runs."""
POLL_S = 30
MAX_MB = 8.0


def configs(quick: bool = False) -> dict[str, RunConfig]:
    """The shipped runs' configs (``quick``: 600 steps, a checkpoint every 150 - for trying the script)."""
    if quick:
        tc = TrainConfig(steps=600, checkpoint_every=150)
        return {"unforced": RunConfig(path="unforced", train=tc, seed=0),
                "fade600to0": RunConfig(path="fade150+150->0", train=tc, seed=0)}
    return {name: RunConfig(path=path, seed=0) for name, path in RUNS.items()}


def wait_for(run_dirs: list[Path], timeout_s: float) -> bool:
    """Poll every 30 s until every ``run_dir/done.json`` exists; False after ``timeout_s``."""
    t0 = time.time()
    while True:
        missing = [d for d in run_dirs if not (d / "done.json").is_file()]
        if not missing:
            return True
        if time.time() - t0 >= timeout_s:
            return False
        print(f"waiting for {', '.join(d.name for d in missing)} ({time.time() - t0:.0f} s)", flush=True)
        time.sleep(POLL_S)


def copy_run(run_dir: Path, dest: Path) -> Path:
    """Copy config, metrics, done marker and the weight files (no optimizer state) to ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    (dest / CKPT_DIR).mkdir(parents=True)
    for name in ("config.json", "metrics.csv", "done.json"):
        shutil.copy2(run_dir / name, dest / name)
    for f in sorted((run_dir / CKPT_DIR).glob("step_*.safetensors")):
        if not f.name.endswith(".state.safetensors"):
            shutil.copy2(f, dest / CKPT_DIR / f.name)
    return dest


def write_figures(figures: dict, out: Path, *, embed: bool) -> list[str]:
    """Each figure as ``<name>.html`` and, when an image exporter works (:func:`export.image_exporter`), ``.png``."""
    out.mkdir(parents=True, exist_ok=True)
    exporter, why = export.image_exporter()
    if exporter is None:
        print(f"PNG export skipped: {why}; {export.EXPORTER_HINT}")
    written = []
    for name, fig in figures.items():
        plots.save(fig, out / f"{name}.html", plotlyjs="embed" if embed else "cdn")
        written.append(f"{name}.html")
        if exporter is not None:
            plots.save(fig, out / f"{name}.png")
            written.append(f"{name}.png")
    return written


def make_figures(series_dirs: dict[str, Path], out: Path, *, n: int, embed: bool) -> dict:
    """Trace the fade series, build the timeline table and every README figure."""
    fade = attach(series_dirs["fade600to0"])
    unforced = attach(series_dirs["unforced"])
    task = fade.task
    batch = eval_set(task, n=n, seed=EVAL_SEED)
    t0 = time.time()
    traced = trace(fade, {"head_diagnostics": head_diagnostics}, task, batch=batch)
    trace_s = time.time() - t0
    gz = fade.gate_zero_step()
    timeline = consolidation_timeline(traced, gate_zero_step=gz)
    metrics = {name: read_metrics(d) for name, d in series_dirs.items()}
    gate = metrics["fade600to0"][["step", "gate_pos", "gate_content"]]
    final = unforced[unforced.steps[-1]]
    interventions = gate_intervention_table(final, eval_set(unforced.task, n=n, seed=EVAL_SEED), unforced.task)
    interventions.insert(0, "step", unforced.steps[-1])

    figures = {
        "fade600to0_ablation_importance_heatmap": plots.head_heatmap(traced, ABLATION_IMPORTANCE),
        "fade600to0_successor_mass_heatmap": plots.head_heatmap(traced, SUCCESSOR_MASS),
    }
    for metric in (SUCCESSOR_MASS, ABLATION_IMPORTANCE):
        fig = plots.head_timeline(traced, metric, gate=gate, threshold=DEFAULT_THRESHOLDS[metric], gate_zero_step=gz)
        figures[f"fade600to0_timeline_{metric}"] = fig
    paths = {"fade600to0": fade.metadata["path"], "unforced": unforced.metadata["path"]}
    for name, m in metrics.items():
        fig = plots.training_curves(m)
        fig.update_layout(title=dict(text=f"Evaluation during training: {paths[name]} (seed 0)"))
        figures[f"training_curves_{name}"] = fig
    figures["unforced_gate_interventions"] = plots.gate_intervention_bar(interventions, chance=task.chance).update_layout(
        title=dict(text="unforced run, final checkpoint: gates zeroed at evaluation"))

    written = write_figures(figures, out, embed=embed)
    table = markdown_table(timeline)
    (out / "consolidation_timeline.md").write_text(
        f"Consolidation timeline of the shipped series `fade600to0` (head_diagnostics, n = {n}, "
        f"every checkpoint; thresholds {DEFAULT_THRESHOLDS}):\n\n{table}\n\n"
        f"Gate interventions of the shipped series `unforced` at step {unforced.steps[-1]}:\n\n"
        f"{markdown_table(interventions)}\n"
    )
    return {"timeline": timeline, "table": table, "interventions": interventions, "trace_s": trace_s,
            "n_checkpoints": len(fade), "written": written}


CIRCUIT_STEPS = (0, 600, 1200, 2400, 3600)
"""The checkpoints of the shipped fade series the circuit figures trace."""


def make_circuit_figures(fade_dir: Path, out: Path, *, n: int = 32, steps: int = 3, embed: bool = False) -> list[str]:
    """The figures of the docs' "Circuits across checkpoints" page, from the shipped fade series:
    ``circuits_graph`` (the top-12 edges at the last step), ``circuits_edge_heatmap`` (the top 20
    edges over :data:`CIRCUIT_STEPS`) and ``circuits_faithfulness`` (the faithfulness curve at the
    last step), EAP-IG with ``steps`` steps on ``n`` examples and their counterfactual pairs."""
    from circuitfade.analysis.edges import counterfactual_batch, edge_attribution, edge_scores, faithfulness_curve
    from circuitfade.viz.circuits import circuit_graph, edge_heatmap, faithfulness_figure

    fade = attach(fade_dir).select(list(CIRCUIT_STEPS))
    traced = trace(fade, [edge_attribution(steps=steps)], n=n, progress=False)
    last = fade.steps[-1]
    clean = eval_set(fade.task, n=n)
    corrupted = counterfactual_batch(clean)
    model = fade[last]
    scores = edge_scores(model, clean, corrupted, method="eap-ig", steps=steps)
    curve = faithfulness_curve(model, clean, corrupted, scores, ks=[0, 2, 5, 10, 15, 20, 30, 40, 60, len(scores)])
    figures = {
        "circuits_graph": circuit_graph(traced, k=12, step=last),
        "circuits_edge_heatmap": edge_heatmap(traced, top=20),
        "circuits_faithfulness": faithfulness_figure(curve, fraction=0.8),
    }
    return write_figures(figures, out, embed=embed)


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="runs/assets", help="sweep root the runs are trained into (default runs/assets)")
    ap.add_argument("--out", default=str(ASSETS), help="figures folder's parent (default: this script's folder)")
    ap.add_argument("--series-out", default=str(SERIES), help="where the series go (default: the package's data/series)")
    ap.add_argument("--wait", type=float, default=0.0, metavar="S",
                    help="wait up to S seconds for another process to finish the runs instead of training them")
    ap.add_argument("--n", type=int, default=EVAL_SIZE, help=f"evaluation examples for tracing (default {EVAL_SIZE})")
    ap.add_argument("--workers", type=int, default=2, help="training processes (default 2)")
    ap.add_argument("--embed-plotlyjs", action="store_true", help="embed plotly.js in each HTML (offline, ~4.8 MB each)")
    ap.add_argument("--quick", action="store_true", help="600-step runs, for trying the script (not for shipping)")
    ap.add_argument("--figures-only", action="store_true",
                    help="redraw assets/figures from the shipped series (no training)")
    ap.add_argument("--circuit-figures-only", action="store_true",
                    help="redraw only the circuit figures of the docs from the shipped fade series")
    ns = ap.parse_args(argv)
    torch.set_num_threads(1)
    t_start = time.time()
    if ns.circuit_figures_only:
        written = make_circuit_figures(Path(ns.series_out) / "fade600to0", Path(ns.out) / "figures",
                                       embed=ns.embed_plotlyjs)
        print(f"figures: {', '.join(written)} ({time.time() - t_start:.0f} s)")
        return 0
    if ns.figures_only:
        out = Path(ns.out)
        res = make_figures({name: Path(ns.series_out) / name for name in RUNS}, out / "figures", n=ns.n,
                           embed=ns.embed_plotlyjs)
        res["written"] += make_circuit_figures(Path(ns.series_out) / "fade600to0", out / "figures",
                                               embed=ns.embed_plotlyjs)
        print(res["table"])
        print(f"\nfigures: {', '.join(res['written'])} ({time.time() - t_start:.0f} s)")
        return 0

    cfgs = configs(ns.quick)
    run_dirs = {name: run_dir_for(ns.root, c) for name, c in cfgs.items()}
    for name, d in run_dirs.items():
        print(f"{name}: {cfgs[name].path} -> {d}")
    if ns.wait > 0 and not wait_for(list(run_dirs.values()), ns.wait):
        print(f"runs not finished after {ns.wait:.0f} s; not training them here (another process may be). "
              "Rerun later, or without --wait to train them.", file=sys.stderr)
        return 1
    results = run_sweep(list(cfgs.values()), ns.root, workers=ns.workers)
    failed = results[results["status"] == "failed"]
    if len(failed):
        print(failed[["run", "error"]].to_string(), file=sys.stderr)
        return 1

    out = Path(ns.out)
    series_dirs = {name: copy_run(d, Path(ns.series_out) / name) for name, d in run_dirs.items()}
    res = make_figures(series_dirs, out / "figures", n=ns.n, embed=ns.embed_plotlyjs)
    res["written"] += make_circuit_figures(series_dirs["fade600to0"], out / "figures", embed=ns.embed_plotlyjs)

    print(f"\nConsolidation timeline of {series_dirs['fade600to0']} "
          f"({res['n_checkpoints']} checkpoints, n = {ns.n}; traced in {res['trace_s']:.1f} s):\n")
    print(res["table"])
    print("\nGate interventions, unforced, final checkpoint:\n")
    print(markdown_table(res["interventions"]))
    print(f"\nfigures: {', '.join(res['written'])}")
    total = _size_mb(Path(ns.series_out)) + _size_mb(out / "figures")
    print(f"sizes: series {_size_mb(Path(ns.series_out)):.2f} MB, figures {_size_mb(out / 'figures'):.2f} MB, "
          f"total {total:.2f} MB (limit {MAX_MB:g} MB); {time.time() - t_start:.0f} s in all")
    if total > MAX_MB:
        print(f"assets exceed {MAX_MB:g} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
