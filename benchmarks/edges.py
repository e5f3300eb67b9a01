"""Edge attribution on the shipped fade series: time per checkpoint, agreement with exact patching, memory.

For every selected checkpoint of ``example_series("fade600to0")`` (2 layers, 4 heads, the
content prior: 89 edges) on ``--n`` associative-recall examples paired by
``counterfactual_batch``:

* seconds for EAP, EAP-IG (``--steps``) and exact patching of every edge (one forward each);
* the Spearman correlation of EAP and EAP-IG with the exact effects over all edges;
* the smallest top-k circuit (by EAP-IG) recovering 0.8 of the logit difference.

Then ``trace(series, [edge_attribution(...)])`` over the first 2 and over all selected
checkpoints in one process, with the peak resident memory after each (the ratio is the growth
with the number of checkpoints; one model is loaded at a time, so it stays near 1).

    python benchmarks/edges.py [--n 32] [--steps 5] [--every 1]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]


def peak_mib() -> float:
    """Peak resident memory of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(n: int, steps: int, every: int) -> dict:
    """Every figure of the module docstring, as a dict."""
    sys.path.insert(0, str(REPO))
    from circuitfade.analysis.edges import (counterfactual_batch, edge_attribution, edge_effects, edge_graph,
                                            edge_scores, faithfulness_curve, smallest_circuit)
    from circuitfade.store import trace
    from circuitfade.store.examples import example_series
    from circuitfade.tasks import eval_set

    series = example_series("fade600to0")
    chosen = series.steps[::every]
    clean = eval_set(series.task, n=n)
    corrupted = counterfactual_batch(clean)
    rows = []
    for step in chosen:
        model = series[step]
        graph = edge_graph(model)
        t0 = time.perf_counter()
        eap = edge_scores(model, clean, corrupted, method="eap", graph=graph)
        t1 = time.perf_counter()
        ig = edge_scores(model, clean, corrupted, steps=steps, graph=graph)
        t2 = time.perf_counter()
        exact = edge_effects(model, clean, corrupted, graph=graph)
        t3 = time.perf_counter()
        curve = faithfulness_curve(model, clean, corrupted, ig, graph=graph)
        rows.append({"step": int(step), "edges": len(graph), "eap_s": t1 - t0, "eap_ig_s": t2 - t1, "exact_s": t3 - t2,
                     "spearman_eap": float(eap["value"].corr(exact["value"], method="spearman")),
                     "spearman_eap_ig": float(ig["value"].corr(exact["value"], method="spearman")),
                     "k80": smallest_circuit(curve, 0.8)["k"]})
        print(rows[-1], flush=True)
        del model
    metric = edge_attribution(steps=steps)
    first = series.select(chosen[:2])
    trace(first, [metric], n=n, progress=False)
    mem_two = peak_mib()
    trace(series.select(chosen), [metric], n=n, progress=False)
    mem_all = peak_mib()
    return {"n": n, "steps": steps, "checkpoints": [int(s) for s in chosen], "rows": rows,
            "peak_mib_two": mem_two, "peak_mib_all": mem_all, "memory_ratio": mem_all / mem_two}


def markdown(result: dict) -> str:
    """The results table the docs include."""
    lines = [f"`{result['command']}`", "",
             f"{result['n']} examples, EAP-IG with {result['steps']} steps, "
             f"{result['rows'][0]['edges']} edges per checkpoint.", "",
             "| step | EAP s | EAP-IG s | exact s | Spearman EAP | Spearman EAP-IG | edges for 0.8 |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['step']} | {r['eap_s']:.2f} | {r['eap_ig_s']:.2f} | {r['exact_s']:.2f} | "
                     f"{r['spearman_eap']:.3f} | {r['spearman_eap_ig']:.3f} | {r['k80']} |")
    lines += ["", f"Peak memory: {result['peak_mib_two']:.0f} MiB after tracing 2 checkpoints, "
              f"{result['peak_mib_all']:.0f} MiB after tracing {len(result['checkpoints'])} "
              f"(ratio {result['memory_ratio']:.2f})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=32, help="evaluation examples (default %(default)s)")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG integration steps (default %(default)s)")
    ap.add_argument("--every", type=int, default=1, help="use every k-th checkpoint (default %(default)s: all 13)")
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                  "(default: results/benchmarks/edges.json in the repository)")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "edges.json")
    if args.n < 2 or args.steps < 1 or args.every < 1:
        ap.error("--n must be at least 2, --steps and --every at least 1")
    result = {"command": command_line(__file__, argv), **measure(args.n, args.steps, args.every)}
    write_outputs(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
