"""Noise measurements (issue 17, item 6, first pieces): the FDT statistic on our own SGD training, and a
small annealing demo of :class:`~circuitfade.train.langevin.LangevinNoise`.

* :func:`sgd_fdt_run`: plain SGD (no momentum, no weight decay, no clipping: the relation needs the update to
  be exactly ``-lr * g``) on the base soft-prior model on a task; records ``theta . g`` and ``|g|^2`` every
  step and reports :func:`~circuitfade.analysis.fdt.fdt_statistic` over an early window (still descending)
  and over the last part of the run.
* :func:`anneal_demo`: ``n`` independent particles in a tilted double well ``L(x) = (x^2 - 1)^2 + tilt x``,
  all started in the shallow well at ``x = +1``; plain SGD keeps them there, Langevin noise at a temperature
  annealed to 0 on a schedule carries most into the deep well at ``x ~ -1``. Fractions with Wilson intervals.

``python -m circuitfade.experiments.noise fdt`` / ``... anneal`` print the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch

from circuitfade.analysis.fdt import FDTRecorder
from circuitfade.model import SoftPriorTransformer
from circuitfade.stats import wilson_interval
from circuitfade.tasks import make_task
from circuitfade.train.langevin import LangevinNoise

__all__ = ["anneal_demo", "sgd_fdt_run"]


def sgd_fdt_run(steps: int = 3000, lr: float = 0.1, batch_size: int = 64, seed: int = 0, task: str = "assoc",
                temperature: float | str = 0.0, last: float = 0.5, early: tuple[int, int] = (0, 200),
                n_batches: int = 20, weight_decay: float = 0.0, progress: bool = False) -> dict:
    """Train the base model with SGD (optionally Langevin noise) and measure the FDT statistic.

    ``weight_decay`` is added to the loss as ``(wd / 2) |theta|^2`` (so the recorded gradient is the one the
    step applies); the reported losses are the task loss without it."""
    torch.manual_seed(seed)
    model = SoftPriorTransformer(seed=seed)
    t = make_task(task)
    opt = LangevinNoise(torch.optim.SGD(model.parameters(), lr=lr), temperature, seed=seed, total_steps=steps)
    gen = torch.Generator().manual_seed(10_000 + seed)
    rec, losses, temps = FDTRecorder(), [], []
    model.train()
    for step in range(steps):
        batch = t.sample(batch_size, gen)
        loss = t.loss(model(batch.model_input), batch)
        opt.zero_grad()
        if weight_decay:
            (loss + 0.5 * weight_decay * sum((p * p).sum() for p in model.parameters())).backward()
        else:
            loss.backward()
        lv = float(loss.detach())
        if not math.isfinite(lv):
            raise RuntimeError(f"sgd_fdt_run: non-finite loss {lv} at step {step} (lr {lr} too large?)")
        rec.record(model)
        temps.append(opt.temperature_now)
        opt.step()
        losses.append(lv)
        if progress and step % 500 == 0:
            print(f"step {step} loss {lv:.4f}", file=sys.stderr)
    start = int(steps * (1 - last))
    tail = rec.statistic(lr, np.asarray(temps), start=start, n_batches=n_batches)
    e0, e1 = early
    head = FDTRecorder()
    head.theta_dot_grad, head.grad_sq, head.n_params = rec.theta_dot_grad[e0:e1], rec.grad_sq[e0:e1], rec.n_params
    early_stat = head.statistic(lr, np.asarray(temps[e0:e1]), n_batches=10)
    w = max(1, steps // 10)
    return {"task": task, "steps": steps, "lr": lr, "batch_size": batch_size, "seed": seed,
            "temperature": str(temperature), "weight_decay": weight_decay, "n_params": rec.n_params,
            "loss_first_decile": float(np.mean(losses[:w])), "loss_last_decile": float(np.mean(losses[-w:])),
            "window_last": [start, steps], "fdt_last": tail, "window_early": [e0, e1], "fdt_early": early_stat}


def anneal_demo(n: int = 2000, steps: int = 3000, lr: float = 0.01, tilt: float = 0.3, t_start: float = 0.3,
                seed: int = 0) -> dict:
    """Fraction of particles in the deep well (``x < 0``) after plain SGD vs Langevin annealing
    (``T`` linear from ``t_start`` to 0 over the first 80% of the steps, then 0)."""
    out = {"n": n, "steps": steps, "lr": lr, "tilt": tilt}
    schedule = f"linear{t_start}->0@0:{int(0.8 * steps)}"
    for name, temp in (("sgd", 0.0), ("anneal", schedule)):
        x = torch.nn.Parameter(torch.ones(n, dtype=torch.float64))
        opt = LangevinNoise(torch.optim.SGD([x], lr=lr), temp, seed=seed, total_steps=steps)
        for _ in range(steps):
            opt.zero_grad()
            ((x * x - 1) ** 2 + tilt * x).sum().backward()
            opt.step()
        k = int((x.detach() < 0).sum())
        lo, hi = wilson_interval(k, n)
        out[name] = {"temperature": str(temp), "deep_well_fraction": k / n, "lo": lo, "hi": hi,
                     "mean_loss": float(((x.detach() ** 2 - 1) ** 2 + tilt * x.detach()).mean())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m circuitfade.experiments.noise", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    f = sub.add_parser("fdt", help="FDT statistic on SGD training of the base model")
    f.add_argument("--steps", type=int, default=3000)
    f.add_argument("--lr", type=float, default=0.1)
    f.add_argument("--batch-size", type=int, default=64)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--task", default="assoc")
    f.add_argument("--temperature", default="0")
    f.add_argument("--last", type=float, default=0.5, help="fraction of the run at its end to measure over")
    f.add_argument("--weight-decay", type=float, default=0.0, help="L2 term (wd/2)|theta|^2 added to the loss")
    a = sub.add_parser("anneal", help="annealing demo on a tilted double well")
    a.add_argument("--n", type=int, default=2000)
    a.add_argument("--steps", type=int, default=3000)
    a.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.what == "fdt":
        res = sgd_fdt_run(args.steps, args.lr, args.batch_size, args.seed, args.task, args.temperature,
                          args.last, weight_decay=args.weight_decay, progress=True)
    else:
        res = anneal_demo(args.n, args.steps, seed=args.seed)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
