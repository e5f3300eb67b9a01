"""CPU time of ``trace`` with per-head mean ablation against a hand-written TransformerLens loop.

On the shipped series ``example_series("fade600to0")`` (13 checkpoints, a gated soft-prior model of
2 layers and 4 heads) and ``--n`` evaluation examples of its task, each round times, in this one
process with one torch thread (``time.process_time``), alternating which goes first:

* ``trace``: ``trace(series, [head_diagnostics], batch=batch)``: successor mass under the gates as
  they are, then mean-ablation accuracy drop and loss increase of every head at zero gate, each
  with its bootstrap interval (:data:`~circuitfade.stats.DEFAULT_RESAMPLES` resamples of the
  examples) and resampled values;
* ``hand``: the same numbers written out by hand: per checkpoint build the model and load its
  weights, one ``run_with_hooks`` forward reading ``hook_pattern`` (successor mass), one clean
  forward at zero gate storing each layer's position-wise batch mean of ``hook_z``, then one
  ``run_with_hooks`` forward per head replacing that head's ``z`` by its mean; accuracy and loss at
  the answer positions; the same bootstrap resamples drawn with numpy.

Both run with the C allocator keeping freed memory for reuse (``trace`` turns it on for the process,
as the trainers do, and the warm-up runs ``trace`` first), so the ratio compares the arithmetic and
the bookkeeping, not page faults.

Before timing, every value, standard error and interval end of the two must agree to 1e-5 (else
the script stops). Printed and written to ``results/benchmarks/trace_speed.json`` (and ``.md``):
each round's CPU seconds, the medians and the ratio trace / hand (target <= 1.05).

    python benchmarks/trace_speed.py [--n 512] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]
TARGET = 1.05


def run_trace(series, batch):
    """``trace`` with :func:`head_diagnostics` (default settings) over every checkpoint."""
    from circuitfade.analysis.heads import head_diagnostics
    from circuitfade.store import trace

    return trace(series, [head_diagnostics], batch=batch, progress=False)


def hand_checkpoint(batch, resamples: int, level: float):
    """A function ``model -> {(metric, layer, head): (value, se, lo, hi)}``: one checkpoint by hand."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    tokens, targets, mask = batch.tokens, batch.targets, batch.answer_mask
    sources = batch.answer_sources.double()
    B = len(tokens)
    counts = mask.sum(1).double().numpy()

    rng = np.random.default_rng(0)  # the bootstrap over examples: resample r = counts of each example
    draws = rng.integers(0, B, size=(resamples, B))
    weights = np.zeros((resamples, B))
    np.add.at(weights, (np.repeat(np.arange(resamples), B), draws.reshape(-1)), 1.0)
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]

    def interval(num):  # num: [B, L, H] per-example sums over answer positions
        boot = np.einsum("rb,blh->rlh", weights, num) / (weights @ counts)[:, None, None]
        lo, hi = np.percentile(boot, q, axis=0)
        return boot.std(0, ddof=1), lo, hi

    def score(logits):  # pooled accuracy and loss (float32), per-example correct counts and CE sums
        lg, tg = logits[mask], targets[mask]
        right = lg.argmax(-1) == tg
        acc = float(right.sum().float() / mask.sum().float())
        loss = float(F.cross_entropy(lg, tg))
        correct = torch.zeros(mask.shape, dtype=torch.float64)
        correct[mask] = right.double()
        ce = torch.zeros(mask.shape, dtype=torch.float64)
        ce[mask] = F.cross_entropy(lg.double(), tg, reduction="none")
        return acc, loss, correct.sum(1).numpy(), ce.sum(1).numpy()

    @torch.no_grad()
    def checkpoint(model) -> dict:
        L, H = model.cfg.n_layers, model.cfg.n_heads
        mass = np.zeros((B, L, H))

        def save_mass(pattern, hook):
            m = torch.einsum("bhqk,bqk->bhq", pattern.double(), sources)
            mass[:, hook.layer()] = (m * mask[:, None, :]).sum(-1).numpy()

        model.run_with_hooks(tokens, return_type=None,
                             fwd_hooks=[(f"blocks.{l}.attn.hook_pattern", save_mass) for l in range(L)])
        means = {}

        def save_mean(z, hook):
            means[hook.layer()] = z.mean(0)

        names = [f"blocks.{l}.attn.hook_z" for l in range(L)]
        drop, rise = np.zeros((L, H)), np.zeros((L, H))
        d_correct, d_ce = np.zeros((B, L, H)), np.zeros((B, L, H))
        with model.gates(**{p: 0.0 for p in model.cfg.priors}):
            acc0, loss0, correct0, ce0 = score(model.run_with_hooks(tokens, fwd_hooks=[(n, save_mean) for n in names]))
            for layer in range(L):
                for head in range(H):
                    def ablate(z, hook, layer=layer, head=head):
                        z = z.clone()
                        z[:, :, head, :] = means[layer][:, head, :]
                        return z

                    acc, loss, correct, ce = score(model.run_with_hooks(tokens, fwd_hooks=[(names[layer], ablate)]))
                    drop[layer, head], rise[layer, head] = acc0 - acc, loss - loss0
                    d_correct[:, layer, head], d_ce[:, layer, head] = correct0 - correct, ce - ce0
        value_mass = (mass.sum(0) / counts.sum()).astype(np.float32).astype(np.float64)
        out = {}
        for metric, value, num in (("successor_mass", value_mass, mass), ("ablation_importance", drop, d_correct),
                                   ("ablation_loss_increase", rise, d_ce)):
            se, lo, hi = interval(num)
            for layer in range(L):
                for head in range(H):
                    out[(metric, layer, head)] = (value[layer, head], se[layer, head], lo[layer, head],
                                                  hi[layer, head])
        return out

    return checkpoint


def run_hand(series, batch, resamples: int, level: float) -> dict:
    """The same numbers by hand: ``{(step, metric, layer, head): (value, se, lo, hi)}``; each model is
    built from the run's config and loaded from its weight file, as a plain loop would."""
    from circuitfade.model import SoftPriorTransformer
    from circuitfade.train.rundir import RunDir

    run_dir = Path(series.metadata["run_dir"])
    cfg = RunDir(run_dir).read_config().model_config()
    checkpoint = hand_checkpoint(batch, resamples, level)
    out = {}
    for step, f in RunDir(run_dir).weight_files().items():
        model = SoftPriorTransformer(cfg)
        model.load_weights(f)
        model.eval()
        out.update({(int(step), *k): v for k, v in checkpoint(model).items()})
        del model
    return out


def compare(df, hand: dict) -> float:
    """Largest absolute difference between the trace and the hand loop (value, se, lo, hi)."""
    got = {(int(r.step), r.metric, int(r.layer), int(r.head)): (r.value, r.se, r.lo, r.hi) for r in df.itertuples()}
    if got.keys() != hand.keys():
        raise SystemExit(f"trace and the hand loop give different rows: {sorted(set(got) ^ set(hand))[:5]}")
    return max(abs(a - b) for k in got for a, b in zip(got[k], hand[k]))


def measure(n: int, rounds: int) -> dict:
    import torch

    from circuitfade.stats import DEFAULT_LEVEL, DEFAULT_RESAMPLES
    from circuitfade.store.examples import example_series
    from circuitfade.tasks import eval_set

    torch.set_num_threads(1)
    series = example_series("fade600to0")
    batch = eval_set(series.task, n=n)
    variants = {"trace": lambda: run_trace(series, batch),
                "hand": lambda: run_hand(series, batch, DEFAULT_RESAMPLES, DEFAULT_LEVEL)}
    diff = compare(variants["trace"](), variants["hand"]())  # also the warm-up of both
    print(f"largest |trace - hand| over value, se, lo, hi: {diff:.2e} (must be <= 1e-5)", flush=True)
    if diff > 1e-5:
        raise SystemExit("trace and the hand loop disagree")
    times = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for k in order:
            t0 = time.process_time()
            variants[k]()
            times[k].append(time.process_time() - t0)
        print(f"round {r + 1}: trace {times['trace'][-1]:.2f} s, hand {times['hand'][-1]:.2f} s, "
              f"ratio {times['trace'][-1] / times['hand'][-1]:.3f}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    m = series[series.steps[-1]]
    return {"n": n, "rounds": rounds, "checkpoints": len(series), "resamples": DEFAULT_RESAMPLES,
            "model": {"n_layers": m.cfg.n_layers, "n_heads": m.cfg.n_heads, "d_model": m.cfg.d_model,
                      "n_pos": int(batch.n_pos)},
            "threads": torch.get_num_threads(), "times": times, "median_trace": med["trace"],
            "median_hand": med["hand"], "ratio": med["trace"] / med["hand"], "max_diff": diff}


def markdown(r: dict) -> str:
    """The measurement as the markdown the docs include."""
    rows = [f"| {i + 1} | {t:.2f} | {h:.2f} | {t / h:.3f} |" for i, (t, h) in
            enumerate(zip(r["times"]["trace"], r["times"]["hand"]))]
    return "\n".join([
        f"`{r['command'].strip()}` ({r['checkpoints']} checkpoints, {r['n']} examples of {r['model']['n_pos']} "
        f"tokens, {r['model']['n_layers']} layers x {r['model']['n_heads']} heads, {r['resamples']} bootstrap "
        f"resamples, {r['threads']} torch thread; CPU seconds per whole series):", "",
        "| round | `trace` | hand-written loop | trace / hand |", "|---|---|---|---|", *rows,
        f"| **median** | {r['median_trace']:.2f} | {r['median_hand']:.2f} | **{r['ratio']:.3f}** (target ≤ {TARGET}) |",
        "", f"Largest difference between the two over every value, standard error and interval end: "
        f"{r['max_diff']:.1g} (required ≤ 1e-5).", ""])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512, help="evaluation examples (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/trace_speed.json in the repository)")
    args = ap.parse_args(argv)
    if args.n < 2 or args.rounds < 1:
        raise SystemExit("--n must be >= 2 and --rounds >= 1")
    sys.path.insert(0, str(REPO))
    result = {"command": command_line(__file__, argv), **measure(args.n, args.rounds)}
    print(f"median CPU seconds: trace {result['median_trace']:.2f}, hand {result['median_hand']:.2f}; "
          f"trace / hand = {result['ratio']:.3f} (target <= {TARGET})")
    write_outputs(args.out or REPO / "results" / "benchmarks" / "trace_speed.json", result, markdown(result))
    return result


if __name__ == "__main__":
    main()
