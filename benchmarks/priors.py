"""Milliseconds per training step for each attention prior, relative to no prior.

Base model (attention-only, L=2, d=64, 4 heads, NoPE), associative-recall batch
of 64, one thread, fused path (no hooks); one step = forward, loss, backward,
grad clipping and an AdamW step. Each prior runs alone with its gate fixed at 1;
``none`` has no prior. Models are timed in interleaved rounds (so machine noise
hits all alike) and the median over rounds is reported.

    python benchmarks/priors.py [--steps 30] [--rounds 5] [--threads 1] [--priors alibi fire]
"""

from __future__ import annotations

import argparse

import torch

from studies.paper.static_baselines import step_time_ms
from circuitfade.model.priors import PRIORS


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="steps per model per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--priors", nargs="+", default=list(PRIORS), choices=list(PRIORS))
    args = ap.parse_args(argv)
    df = step_time_ms(args.priors, steps=args.steps, rounds=args.rounds, threads=args.threads)
    print(f"torch {torch.__version__}, threads {args.threads}, batch 64, {args.steps} steps x {args.rounds} rounds "
          "(median ms per step; ratio to no prior)")
    for _, r in df.iterrows():
        print(f"  {r.prior:14s} {r.ms:7.2f} ms/step  x{r.ratio:5.2f}")
    return df


if __name__ == "__main__":
    main()
