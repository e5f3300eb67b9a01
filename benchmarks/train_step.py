"""Milliseconds per training step, measured side by side in one run.

Compares, on the default model shape (attention-only, L=2, d=64, 4 heads,
ctx 31 tokens of associative recall, batch 64), one AdamW step of:

* ``SoftPriorTransformer`` on its fused path (no hooks attached; what training uses),
* ``SoftPriorTransformer`` forced onto its hooked path,
* a plain ``HookedTransformer`` of the same shape,
* a minimal hand-written PyTorch model of the same shape (nanoGPT-style).

Timings interleave the models round by round so machine noise hits all of them
alike; the median over rounds is reported, then the ratios.

    python benchmarks/train_step.py [--steps 200] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from circuitfade.model import SoftPriorConfig, SoftPriorTransformer
from circuitfade.tasks import AssocRecall


class MinimalModel(nn.Module):
    """Attention-only pre-LN Transformer, written the short way."""

    def __init__(self, d_vocab=32, d_model=64, n_heads=4, n_layers=2):
        super().__init__()
        self.n_heads = n_heads
        self.embed = nn.Embedding(d_vocab, d_model)
        self.lns = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.qkv = nn.ModuleList([nn.Linear(d_model, 3 * d_model) for _ in range(n_layers)])
        self.out = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.unembed = nn.Linear(d_model, d_vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        B, P, D = x.shape
        for ln, qkv, out in zip(self.lns, self.qkv, self.out):
            q, k, v = qkv(ln(x)).view(B, P, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + out(z.transpose(1, 2).reshape(B, P, D))
        return self.unembed(self.ln_f(x))


def make_step(model, batch):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)
    mask = batch.answer_mask

    def step():
        logits = model(batch.tokens)
        loss = F.cross_entropy(logits[mask], batch.targets[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return step


def main(argv=None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    task = AssocRecall()
    batch = task.sample(64, torch.Generator().manual_seed(0))

    soft = SoftPriorTransformer(SoftPriorConfig.base())
    soft_hooked = SoftPriorTransformer(SoftPriorConfig.base())
    soft_hooked.use_fused = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        plain = soft.to_hooked_transformer()
    models = {
        "soft_prior_fused": soft,
        "soft_prior_hooked": soft_hooked,
        "hooked_transformer": plain,
        "minimal_pytorch": MinimalModel(),
    }
    steps = {name: make_step(m, batch) for name, m in models.items()}
    for fn in steps.values():  # warm-up
        for _ in range(20):
            fn()
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, fn in steps.items():
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[name].append((time.perf_counter() - t0) / args.steps * 1e3)
    ms = {name: statistics.median(v) for name, v in times.items()}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch 64, {args.steps} steps x {args.rounds} rounds")
    for name, v in ms.items():
        print(f"  {name:20s} {v:7.3f} ms/step")
    print("ratios:")
    print(f"  soft_prior_fused  / hooked_transformer = {ms['soft_prior_fused'] / ms['hooked_transformer']:.2f}  (target <= 1.3)")
    print(f"  soft_prior_hooked / hooked_transformer = {ms['soft_prior_hooked'] / ms['hooked_transformer']:.2f}")
    print(f"  soft_prior_fused  / minimal_pytorch    = {ms['soft_prior_fused'] / ms['minimal_pytorch']:.2f}  (target <= 1.5)")
    print(f"  hooked_transformer / minimal_pytorch   = {ms['hooked_transformer'] / ms['minimal_pytorch']:.2f}")
    return ms


if __name__ == "__main__":
    main()
