"""Peak memory of ``trace`` over 2 against 40 checkpoints, and per-head mean ablation against a plain loop.

The series is a folder of state dicts of a Pythia-14M-shaped ``HookedTransformer`` (6 layers,
``d_model`` 128, 4 heads of 32, ``d_mlp`` 512, vocabulary 50,304; random weights, one seed per
checkpoint) that the benchmark writes to a temporary folder with its ``config.json``
(``attach(folder)`` reads it). Each measurement runs in a fresh process:

* ``trace K``: ``trace(attach(folder).select(first K steps), {"ablation": mean ablation}, task)``
  with :func:`circuitfade.analysis.heads.mean_ablation_importance` (``gates=None``; one clean
  forward, then one forward per layer on the batch repeated once per head) on ``--n``
  associative-recall sequences; the process reports its peak resident memory
  (``ru_maxrss``), its resident memory after imports, and the time;
* ``loop K``: the plain way, per checkpoint: build the model, load the state dict, one clean
  ``run_with_hooks`` forward that stores each layer's position-wise batch mean of
  ``hook_z``, then one ``run_with_hooks`` forward per head replacing that head's ``z`` by
  its mean, scoring each with the task's loss.

Reported: peak RSS over 2 and over 40 checkpoints and their ratio (target <= 1.2: memory flat in
the number of checkpoints), seconds per checkpoint of both ablations, and the largest
difference between their loss increases (they must agree to 1e-5).

    python benchmarks/trace_memory.py [--n 4] [--checkpoints 40] [--pairs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_files import command_line, with_machine_line, write_outputs

REPO = Path(__file__).resolve().parents[1]

PYTHIA_14M = dict(n_layers=6, d_model=128, n_heads=4, d_head=32, d_mlp=512, d_vocab=50304, n_ctx=64, act_fn="gelu",
                  normalization_type="LN", positional_embedding_type="standard")


def rss_mib() -> float:
    """Resident memory of this process now (MiB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_series(folder: Path, k: int) -> list[int]:
    """``k`` random Pythia-14M-shaped checkpoints ``step{s}.safetensors`` and ``config.json``: one
    initialised model, then each checkpoint its weights plus noise of its own seed (N(0, 0.02^2))."""
    import warnings

    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuitfade.io import save_tensors, write_json

    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", PYTHIA_14M)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        base = HookedTransformer(HookedTransformerConfig(**PYTHIA_14M)).state_dict()
    steps = [1000 * (i + 1) for i in range(k)]
    for s in steps:
        g = torch.Generator().manual_seed(s)
        sd = {n: t + 0.02 * torch.randn(t.shape, generator=g) if t.is_floating_point() and n.endswith(("W_E", "W_U",
              "W_Q", "W_K", "W_V", "W_O", "W_in", "W_out", "W_pos")) else t for n, t in base.items()}
        save_tensors(folder / f"step{s}.safetensors", sd)
    return steps


def _task_and_batch(n: int, pairs: int):
    from circuitfade.tasks import eval_set, make_task

    task = make_task("assoc", n_pairs=pairs)
    return task, eval_set(task, n=n)


def child_trace(folder: Path, k: int, n: int, pairs: int) -> dict:
    import torch

    from circuitfade.analysis.heads import mean_ablation_importance
    from circuitfade.store import attach, metric, trace

    torch.set_num_threads(1)
    task, batch = _task_and_batch(n, pairs)

    @metric(inputs=("model", "batch", "task"))
    def ablation(model, batch, task):
        df = mean_ablation_importance(model, batch, task, gates=None)
        return df.assign(value=df["loss_increase"])[["layer", "head", "value"]]

    series = attach(folder)
    series = series.select(series.steps[:k])
    base = rss_mib()
    t0 = time.perf_counter()
    df = trace(series, {"ablation": ablation}, task, batch=batch, progress=False)
    dt = time.perf_counter() - t0
    values = {f"{r.step}/{r.layer}/{r.head}": r.value for r in df.itertuples()}
    return {"mode": "trace", "checkpoints": k, "seconds": dt, "rss_after_imports_mib": base, "peak_rss_mib": peak_mib(),
            "values": values}


def child_loop(folder: Path, k: int, n: int, pairs: int) -> dict:
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from circuitfade.io import load_tensors

    torch.set_num_threads(1)
    task, batch = _task_and_batch(n, pairs)
    cfg = HookedTransformerConfig(**PYTHIA_14M)
    files = sorted(folder.glob("step*.safetensors"), key=lambda p: int(p.stem[4:]))[:k]
    base = rss_mib()
    values = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        for f in files:
            model = HookedTransformer(cfg)
            model.load_state_dict(load_tensors(f))
            model.eval()
            means = {}

            def save(z, hook, means=means):
                means[hook.layer()] = z.mean(0)  # [pos, head, d_head]

            names = [f"blocks.{l}.attn.hook_z" for l in range(cfg.n_layers)]
            clean = float(task.loss(model.run_with_hooks(batch.tokens, fwd_hooks=[(nm, save) for nm in names]), batch))
            for layer in range(cfg.n_layers):
                for head in range(cfg.n_heads):
                    def ablate(z, hook, layer=layer, head=head):
                        z = z.clone()
                        z[:, :, head, :] = means[layer][:, head, :]
                        return z

                    logits = model.run_with_hooks(batch.tokens, fwd_hooks=[(names[layer], ablate)])
                    values[f"{int(f.stem[4:])}/{layer}/{head}"] = float(task.loss(logits, batch)) - clean
            del model
    dt = time.perf_counter() - t0
    return {"mode": "loop", "checkpoints": k, "seconds": dt, "rss_after_imports_mib": base, "peak_rss_mib": peak_mib(),
            "values": values}


def run_child(mode: str, folder: Path, k: int, args) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, str(folder), str(k), "--n", str(args.n), "--pairs", str(args.pairs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4, help="sequences in the batch (default %(default)s)")
    ap.add_argument("--pairs", type=int, default=8, help="key-value pairs per sequence (default %(default)s)")
    ap.add_argument("--checkpoints", type=int, default=40)
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/trace_memory.json in the repository)")
    ap.add_argument("--child", nargs=3, metavar=("MODE", "FOLDER", "K"), help=argparse.SUPPRESS)
    ap.add_argument("--render", metavar="JSON", help="rewrite the markdown beside a JSON an earlier run wrote")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "trace_memory.json")
    if args.render:
        from circuitfade.io import write_text

        saved = json.loads(Path(args.render).read_text())
        write_text(Path(args.render).with_suffix(".md"), with_machine_line(markdown(saved), saved))
        return saved
    if args.child:
        mode, folder, k = args.child[0], Path(args.child[1]), int(args.child[2])
        fn = child_trace if mode == "trace" else child_loop
        print(json.dumps(fn(folder, k, args.n, args.pairs)))
        return {}
    if args.n < 2 or args.checkpoints < 2:
        raise SystemExit("--n and --checkpoints must be >= 2")
    with tempfile.TemporaryDirectory(prefix="trace_memory_") as tmp:
        folder = Path(tmp) / "pythia14m-shaped"
        t0 = time.perf_counter()
        write_series(folder, args.checkpoints)
        size = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
        print(f"wrote {args.checkpoints} checkpoints ({size:.0f} MiB) in {time.perf_counter() - t0:.0f} s", flush=True)
        few = run_child("trace", folder, 2, args)
        many = run_child("trace", folder, args.checkpoints, args)
        loop = run_child("loop", folder, 2, args)
    ratio = many["peak_rss_mib"] / few["peak_rss_mib"]
    growth = (many["peak_rss_mib"] - many["rss_after_imports_mib"]) / (few["peak_rss_mib"] - few["rss_after_imports_mib"])
    diff = max(abs(few["values"][k] - loop["values"][k]) for k in loop["values"])
    assert few["values"].keys() == loop["values"].keys()
    per_trace, per_loop = few["seconds"] / 2, loop["seconds"] / 2
    print(f"Pythia-14M-shaped model, {args.n} sequences x {2 * args.pairs + 1} tokens, one thread")
    print(f"  trace over 2 checkpoints:  peak RSS {few['peak_rss_mib']:6.0f} MiB (after imports "
          f"{few['rss_after_imports_mib']:.0f})")
    print(f"  trace over {args.checkpoints} checkpoints: peak RSS {many['peak_rss_mib']:6.0f} MiB (after imports "
          f"{many['rss_after_imports_mib']:.0f})")
    print(f"  ratio {ratio:.3f} (target <= 1.2); above the imports: {growth:.2f}x")
    print(f"  per-head mean ablation, seconds per checkpoint: trace {per_trace:.2f} "
          f"({many['seconds'] / args.checkpoints:.2f} over {args.checkpoints}), plain run_with_hooks loop "
          f"{per_loop:.2f}: {per_loop / per_trace:.2f}x")
    print(f"  largest |loss increase (trace) - loss increase (loop)|: {diff:.2e} (must be <= 1e-5)")
    if diff > 1e-5:
        raise SystemExit("trace and the plain loop disagree")
    result = {"command": command_line(__file__, argv),
              "n": args.n, "pairs": args.pairs, "checkpoints": args.checkpoints, "ratio": ratio, "growth": growth,
              "peak_2": few["peak_rss_mib"], "peak_many": many["peak_rss_mib"],
              "after_imports_2": few["rss_after_imports_mib"], "after_imports_many": many["rss_after_imports_mib"],
              "seconds_per_checkpoint_trace": per_trace, "seconds_per_checkpoint_loop": per_loop, "max_diff": diff}
    write_outputs(args.out, result, markdown(result))
    return result


def markdown(r: dict) -> str:
    """The measurement as the markdown the docs include."""
    k = r["checkpoints"]
    return "\n".join([
        f"`{r['command'].strip()}` ({r['n']} sequences of {2 * r['pairs'] + 1} tokens, one thread):", "",
        f"| | 2 checkpoints | {k} checkpoints |", "|---|---|---|",
        f"| peak resident memory | {r['peak_2']:.0f} MiB | {r['peak_many']:.0f} MiB |",
        f"| ratio {k} / 2 (target ≤ 1.2) | | **{r['ratio']:.2f}** |",
        f"| above the memory after imports | {r['peak_2'] - r['after_imports_2']:.0f} MiB | "
        f"{r['peak_many'] - r['after_imports_many']:.0f} MiB ({r['growth']:.2f}×) |", "",
        f"Per-head mean ablation, seconds per checkpoint: `trace` {r['seconds_per_checkpoint_trace']:.2f}, the plain "
        f"`run_with_hooks` loop {r['seconds_per_checkpoint_loop']:.2f} "
        f"(loop / trace = **{r['seconds_per_checkpoint_loop'] / r['seconds_per_checkpoint_trace']:.2f}**, both over "
        f"the same 2 checkpoints); largest "
        f"difference of their loss increases {r['max_diff']:.1g} (required ≤ 1e-5).", ""])


if __name__ == "__main__":
    main()
