"""EAP edge attribution per checkpoint: circuitfade against auto-circuit, side by side on the same work.

Two series, every checkpoint scored by both libraries on the same clean / corrupted batch
(one answer position per example, the last; objective: the logit difference of the clean and
the corrupted answer):

* the default model: the shipped fade series (``example_series("fade600to0")``, the soft-prior
  model with default settings: 2 layers, 4 heads, attention only) at ``--every``-th
  checkpoint, ``--n`` associative-recall examples paired by ``counterfactual_batch``.
  circuitfade scores the soft-prior model under ``gates="zero"`` (89 edges, 8 of them the
  content-prior edges, which carry nothing at gate 0); auto-circuit scores its plain backbone
  (``to_plain_model()``, 81 edges), which computes the same function at gate 0;
* a Pythia-14M-shaped series written locally (6 layers, ``d_model`` 128, 4 heads of 32,
  ``d_mlp`` 512, vocabulary 50,304, LayerNorm; random weights, one seed per checkpoint, as in
  ``benchmarks/trace_memory.py``; no download), ``--pythia-checkpoints`` checkpoints, ``--pythia-n``
  random sequences of ``--pythia-pos`` tokens with a random answer at the last position.

Per checkpoint: seconds for circuitfade's ``edge_scores(method="eap")`` and for auto-circuit's
``patchable_model`` plus ``mask_gradient_prune_scores`` at mask 0 (its EAP; wrapping the model
is part of its work per checkpoint, loading is not counted for either), and the largest
difference between the two scores of a shared edge. One torch thread.

auto-circuit 1.0.1 runs on TransformerLens 3.x only; :mod:`circuitfade.analysis.peers` imports and
runs it (and says where the two differ by design). ``make test``'s environment installs it.

    python benchmarks/edges_auto_circuit.py [--n 32] [--every 3] [--pythia-checkpoints 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]


def compare(ac, model, plain, clean, corrupted, gates) -> dict:
    """Both libraries' EAP on one checkpoint: seconds, edge counts, largest difference."""
    from circuitfade.analysis.edges import edge_graph, edge_scores
    from circuitfade.analysis.peers import auto_circuit_eap

    graph = edge_graph(model)
    t0 = time.perf_counter()
    ours = edge_scores(model, clean, corrupted, method="eap", gates=gates, graph=graph, resamples=200)
    t1 = time.perf_counter()
    ref = auto_circuit_eap(plain, clean, corrupted, ac=ac)
    t2 = time.perf_counter()
    shared = ours[ours["edge"].isin(list(ref))]
    diff = max(abs(v - ref[e]) for e, v in zip(shared["edge"], shared["value"]))
    return {"edges_circuitfade": len(ours), "edges_auto_circuit": len(ref), "shared": len(shared),
            "circuitfade_s": t1 - t0, "auto_circuit_s": t2 - t1, "max_abs_diff": float(diff),
            "max_abs_score": float(shared["value"].abs().max())}


def default_series(ac, n: int, every: int) -> list[dict]:
    from circuitfade.analysis.edges import counterfactual_batch
    from circuitfade.store.examples import example_series
    from circuitfade.tasks import eval_set

    series = example_series("fade600to0")
    clean = eval_set(series.task, n=n)
    corrupted = counterfactual_batch(clean)
    rows = []
    for step in series.steps[::every]:
        model = series[step]
        rows.append({"series": "default (fade600to0)", "step": int(step),
                     **compare(ac, model, model.to_plain_model(), clean, corrupted, "zero")})
        print(rows[-1], flush=True)
    return rows


def pythia_series(ac, k: int, n: int, pos: int) -> list[dict]:
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from trace_memory import PYTHIA_14M, write_series

    from circuitfade.analysis.edges import counterfactual_batch
    from circuitfade.io import load_tensors
    from circuitfade.tasks import Batch

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, PYTHIA_14M["d_vocab"], (n, pos), generator=gen)
    targets = torch.full_like(tokens, -100)
    targets[:, -1] = torch.randint(0, PYTHIA_14M["d_vocab"], (n,), generator=gen)
    clean = Batch.from_answers(tokens, [[pos - 1]] * n, targets=targets)
    corrupted = counterfactual_batch(clean)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "pythia14m-shaped"
        steps = write_series(folder, k)
        cfg = HookedTransformerConfig(**PYTHIA_14M)
        for s in steps:
            models = []
            for _ in range(2):  # one for circuitfade, one for auto-circuit to wrap
                m = HookedTransformer(cfg)
                m.load_state_dict(load_tensors(folder / f"step{s}.safetensors"))
                m.eval()
                models.append(m)
            rows.append({"series": "Pythia-14M-shaped", "step": int(s),
                         **compare(ac, models[0], models[1], clean, corrupted, None)})
            print(rows[-1], flush=True)
    return rows


def markdown(result: dict) -> str:
    lines = [f"`{result['command']}`", "",
             f"EAP (one gradient pass) per checkpoint, one torch thread. Default model: {result['n']} "
             f"associative-recall examples; Pythia-14M-shaped: {result['pythia_n']} random sequences of "
             f"{result['pythia_pos']} tokens. auto-circuit {result['auto_circuit']}, TransformerLens "
             f"{result['transformer_lens']}. circuitfade's time includes its bootstrap interval (200 resamples); "
             "auto-circuit's includes wrapping the model.", "",
             "| series | step | edges (circuitfade / auto-circuit) | circuitfade s | auto-circuit s | "
             "largest difference (largest score) |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['series']} | {r['step']} | {r['edges_circuitfade']} / {r['edges_auto_circuit']} | "
                     f"{r['circuitfade_s']:.2f} | {r['auto_circuit_s']:.2f} | "
                     f"{r['max_abs_diff']:.1e} ({r['max_abs_score']:.2f}) |")
    for name, (a, b) in result["means"].items():
        lines.append("")
        lines.append(f"{name}: mean {a:.2f} s per checkpoint (circuitfade) against {b:.2f} s (auto-circuit).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="default-model examples (default %(default)s)")
    ap.add_argument("--every", type=int, default=3, help="every k-th fade checkpoint (default %(default)s)")
    ap.add_argument("--pythia-checkpoints", type=int, default=3, help="Pythia-shaped checkpoints (default %(default)s)")
    ap.add_argument("--pythia-n", type=int, default=8, help="Pythia-shaped sequences (default %(default)s)")
    ap.add_argument("--pythia-pos", type=int, default=32, help="their length (default %(default)s)")
    ap.add_argument("--out", help="the JSON written (default: results/benchmarks/edges_auto_circuit.json)")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "edges_auto_circuit.json")
    if min(args.n, args.pythia_n) < 2 or min(args.every, args.pythia_checkpoints) < 1 or args.pythia_pos < 2:
        ap.error("--n and --pythia-n must be at least 2, --pythia-pos at least 2, the others at least 1")
    sys.path.insert(0, str(REPO))
    import importlib.metadata as md
    import warnings

    import torch

    from circuitfade import compat

    if compat.is_tl4():
        ap.error("auto-circuit 1.0.1 needs TransformerLens 3.x (HookedTransformer was removed in 4.0)")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", DeprecationWarning)
    from circuitfade.analysis.peers import import_auto_circuit

    ac = import_auto_circuit()
    rows = default_series(ac, args.n, args.every) + pythia_series(ac, args.pythia_checkpoints, args.pythia_n,
                                                                  args.pythia_pos)
    means = {}
    for name in dict.fromkeys(r["series"] for r in rows):
        rs = [r for r in rows if r["series"] == name]
        means[name] = (sum(r["circuitfade_s"] for r in rs) / len(rs), sum(r["auto_circuit_s"] for r in rs) / len(rs))
    result = {"command": command_line(__file__, argv), "n": args.n, "pythia_n": args.pythia_n,
              "pythia_pos": args.pythia_pos, "auto_circuit": md.version("auto-circuit"),
              "transformer_lens": md.version("transformer-lens"), "rows": rows, "means": means}
    write_outputs(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
