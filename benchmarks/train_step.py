"""Milliseconds per training step, measured side by side in one run.

Compares, on the default model shape (attention-only, L=2, d=64, 4 heads,
ctx 31 tokens of associative recall, batch 64), one AdamW step (forward, loss at
the answer position, backward, clipping, AdamW) of:

* ``soft_prior_fused``: ``SoftPriorTransformer`` on its fused path, every position computed,
* ``soft_prior_answer``: the same on the answer-position path (what training uses now:
  the last block computes queries, attention, output and logits only at the answer position),
* ``no_priors_answer``: the same model with no priors (the backbone's own cost),
* ``soft_prior_compiled``: ``torch.compile`` of the answer-path model (``--no-compile`` skips it),
* ``soft_prior_hooked``: forced onto its hooked path,
* ``hooked_transformer``: a plain ``HookedTransformer`` of the same shape,
* ``minimal_pytorch``: a minimal hand-written PyTorch model of the same shape (nanoGPT-style),
  every position computed, and ``minimal_answer``, the same trick written by hand.

Timings interleave the models round by round so machine noise hits all of them
alike (:func:`circuitfade.train.timing.time_steps`), by this process's CPU time (one
thread; ``--clock wall`` for wall time); the median over rounds is reported, then the
ratios, each next to its target: the answer path within 1.10x of the minimal model's
answer-only step (the priors' cost), and the fused path within 1.2x of the minimal model. The compile time (first call,
with TorchInductor's on-disk cache in a fresh folder: a first compile on the machine), and again for a
second model compiled with that cache warm, is reported with the number of steps it takes to pay for itself.

    python benchmarks/train_step.py [--steps 200] [--rounds 5] [--threads 1] [--no-compile] [--clock cpu|wall]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from circuitfade.gating.evaluation import answer_logits
from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.tasks import AssocRecall
from circuitfade.train.timing import adamw_step, median_ms, time_steps, torch_threads

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]


class MinimalModel(nn.Module):
    """Attention-only pre-LN Transformer, written the short way (``rows``: last block only there)."""

    def __init__(self, d_vocab=32, d_model=64, n_heads=4, n_layers=2):
        super().__init__()
        self.n_heads = n_heads
        self.embed = nn.Embedding(d_vocab, d_model)
        self.lns = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.qkv = nn.ModuleList([nn.Linear(d_model, 3 * d_model) for _ in range(n_layers)])
        self.out = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, d_vocab)

    def forward(self, tokens, rows=None):
        x = self.embed(tokens)
        B, P, D = x.shape
        H = self.n_heads
        for i, (ln, qkv, out) in enumerate(zip(self.lns, self.qkv, self.out)):
            q, k, v = qkv(ln(x)).view(B, P, 3, H, D // H).permute(2, 0, 3, 1, 4)
            if rows is not None and i == len(self.lns) - 1:
                mask = torch.ones(P, P, dtype=torch.bool).tril()[rows]
                z = F.scaled_dot_product_attention(q[:, :, rows], k, v, attn_mask=mask)
                x = x[:, rows] + out(z.transpose(1, 2).reshape(B, len(rows), D))
            else:
                z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + out(z.transpose(1, 2).reshape(B, P, D))
        return self.unembed(self.ln_f(x))


def main(argv=None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="time by this process's CPU time (default; steadier on a shared machine) or wall time")
    ap.add_argument("--out", help="the JSON written with every figure, and the markdown beside it "
                                    "(default: results/benchmarks/train_step.json in the repository)")
    args = ap.parse_args(argv)
    args.out = args.out or str(REPO / "results" / "benchmarks" / "train_step.json")
    torch.manual_seed(0)
    task = AssocRecall()
    batch = task.sample(64, torch.Generator().manual_seed(0))
    mask, rows = batch.answer_mask, batch.answer_mask.any(0).nonzero().flatten()

    def full_loss(model):
        return lambda: F.cross_entropy(model(batch.tokens)[mask], batch.targets[mask])

    with torch_threads(args.threads):
        soft = SoftPriorTransformer(SoftPriorConfig.base())
        answer = SoftPriorTransformer(SoftPriorConfig.base())
        no_priors = SoftPriorTransformer(SoftPriorConfig.base(priors=()))
        hooked = SoftPriorTransformer(SoftPriorConfig.base())
        hooked.use_fused = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            plain = soft.to_plain_model()
        minimal, minimal_answer = MinimalModel(), MinimalModel()
        fns = {
            "soft_prior_fused": adamw_step(soft, full_loss(soft)),
            "soft_prior_answer": adamw_step(answer, lambda: task.loss(answer_logits(answer, batch), batch)),
            "no_priors_answer": adamw_step(no_priors, lambda: task.loss(answer_logits(no_priors, batch), batch)),
        }
        compile_s = None
        warm_s = None
        if not args.no_compile:
            # a first compile on a machine: TorchInductor's cache in a fresh folder (it is on disk and outlives
            # the process: a second compile of the same model, anywhere on the machine, mostly reads it)
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="circuitfade-inductor-")

            def compiled_step():
                compiled_model = SoftPriorTransformer(SoftPriorConfig.base())
                compiled = torch.compile(compiled_model)
                step = adamw_step(compiled_model, lambda: task.loss(compiled(batch.tokens, positions=rows), batch))
                t0 = time.perf_counter()
                step()  # compiles forward and backward
                return step, time.perf_counter() - t0

            _, compile_s = compiled_step()
            torch._dynamo.reset()  # forget the compiled graphs in memory; the cache on disk stays
            step, warm_s = compiled_step()
            fns["soft_prior_compiled"] = step
        fns.update({
            "soft_prior_hooked": adamw_step(hooked, full_loss(hooked)),
            "hooked_transformer": adamw_step(plain, full_loss(plain)),
            "minimal_pytorch": adamw_step(minimal, full_loss(minimal)),
            "minimal_answer": adamw_step(minimal_answer, lambda: F.cross_entropy(
                minimal_answer(batch.tokens, rows)[:, 0], batch.targets[:, rows[0]])),
        })
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    ms = median_ms(time_steps(fns, steps=args.steps, rounds=args.rounds, warmup=20, threads=args.threads, clock=clock))
    print(f"torch {torch.__version__}, threads {args.threads}, batch 64, {args.steps} steps x {args.rounds} rounds "
          f"(median {args.clock} ms per step)")
    for name, v in ms.items():
        print(f"  {name:20s} {v:7.3f} ms/step")
    mini = ms["minimal_pytorch"]
    print("ratios:")
    print(f"  soft_prior_fused   / minimal_pytorch    = {ms['soft_prior_fused'] / mini:.2f}  (target <= 1.2)")
    print(f"  soft_prior_answer  / minimal_pytorch    = {ms['soft_prior_answer'] / mini:.2f}")
    print(f"  soft_prior_answer  / minimal_answer     = {ms['soft_prior_answer'] / ms['minimal_answer']:.2f}"
          "  (target <= 1.10)")
    print(f"  no_priors_answer   / minimal_answer     = {ms['no_priors_answer'] / ms['minimal_answer']:.2f}")
    print(f"  soft_prior_answer  / soft_prior_fused   = {ms['soft_prior_answer'] / ms['soft_prior_fused']:.2f}")
    print(f"  soft_prior_fused   / hooked_transformer = {ms['soft_prior_fused'] / ms['hooked_transformer']:.2f}")
    print(f"  soft_prior_hooked  / hooked_transformer = {ms['soft_prior_hooked'] / ms['hooked_transformer']:.2f}")
    print(f"  hooked_transformer / minimal_pytorch    = {ms['hooked_transformer'] / mini:.2f}")
    if compile_s is not None:
        saved = ms["soft_prior_answer"] - ms["soft_prior_compiled"]
        verdict = (f"pays off after {compile_s * 1e3 / saved:.0f} steps" if saved > 0
                   else "never pays off here (compiled step is not faster)")
        print(f"  soft_prior_compiled / soft_prior_answer = {ms['soft_prior_compiled'] / ms['soft_prior_answer']:.2f}"
              f"; compile time {compile_s:.1f} s: {verdict}; again with the cache warm {warm_s:.1f} s")
        ms["compile_s"] = compile_s
        ms["compile_warm_s"] = warm_s
    command = command_line(__file__, argv)
    write_outputs(args.out, {"command": command, "torch": torch.__version__, "threads": args.threads,
                             "steps": args.steps, "rounds": args.rounds, "clock": args.clock, "ms_per_step": ms},
                  markdown(ms, command, args))
    return ms


ROWS = (("soft_prior_fused", "SoftPriorTransformer, fused path, every position"),
        ("soft_prior_answer", "SoftPriorTransformer, answer-position path (what training uses)"),
        ("no_priors_answer", "the same with no priors"),
        ("soft_prior_compiled", "the same, `torch.compile`"),
        ("soft_prior_hooked", "SoftPriorTransformer, hooked path"),
        ("hooked_transformer", "plain HookedTransformer, same shape"),
        ("minimal_pytorch", "minimal hand-written PyTorch model, every position"),
        ("minimal_answer", "minimal model, answer position only"))


def markdown(ms: dict, command: str, args) -> str:
    """The table and ratios the docs include."""

    def met(ratio: float, target: float) -> str:
        return "met" if ratio <= target else "**not met**"

    fused = ms["soft_prior_fused"] / ms["minimal_pytorch"]
    answer = ms["soft_prior_answer"] / ms["minimal_answer"]
    clock = "CPU" if getattr(args, "clock", "cpu") == "cpu" else "wall"
    lines = [f"`{command}` (torch {torch.__version__}, {args.threads} thread, batch 64, median {clock} time over "
             f"{args.rounds} rounds of {args.steps} steps):", "", "| model | ms/step |", "|---|---|"]
    lines += [f"| {label} | {ms[k]:.1f} |" for k, label in ROWS if k in ms]
    lines += [f"| **answer path / minimal answer-only** (target ≤ 1.10) | **{answer:.2f}**: {met(answer, 1.10)} |",
              f"| no priors, answer path / minimal answer-only | {ms['no_priors_answer'] / ms['minimal_answer']:.2f} |",
              f"| **fused / minimal** (target ≤ 1.2) | **{fused:.2f}**: {met(fused, 1.2)} |",
              f"| plain HookedTransformer / fused | {ms['hooked_transformer'] / ms['soft_prior_fused']:.2f} |",
              f"| answer path / fused | {ms['soft_prior_answer'] / ms['soft_prior_fused']:.2f} |",
              f"| minimal answer / minimal | {ms['minimal_answer'] / ms['minimal_pytorch']:.2f} |"]
    if "compile_s" in ms:
        saved = ms["soft_prior_answer"] - ms["soft_prior_compiled"]
        pays = f"pays off after {ms['compile_s'] * 1e3 / saved:.0f} steps" if saved > 0 else "never pays off"
        lines.append(f"| compiled / answer path | {ms['soft_prior_compiled'] / ms['soft_prior_answer']:.2f}; compiling took "
                     f"{ms['compile_s']:.0f} s the first time ({pays}) |")
        if ms.get("compile_warm_s") is not None and saved > 0:
            lines.append(f"| compiling a second model in the process, TorchInductor's cache on disk warm | "
                         f"{ms['compile_warm_s']:.1f} s (pays off "
                         f"after {ms['compile_warm_s'] * 1e3 / saved:.0f} steps) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
