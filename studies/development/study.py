"""The developmental-screens study: the local developing series (or a given series) screened
revision by revision; tables and an HTML report under ``results/development/``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from circuitfade.io import check_outputs
from circuitfade.train.recipes import LOCAL_STEPS, build_local_series
from circuitfade.viz.screens import TABLES, run

__all__ = ["build_parser", "main"]


def build_parser(prog: str = "python -m studies.development") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="Screen every head of every revision of the local developing "
                                 "series (or --series) and write tables and a report under OUT")
    ap.add_argument("--series", help="a run directory, a folder of Hugging Face revisions or of state dicts "
                                     "(default: train the local developing series into OUT/runs/local-series)")
    ap.add_argument("--steps", type=int, default=LOCAL_STEPS, help=f"steps of the local series (default {LOCAL_STEPS})")
    ap.add_argument("--n", type=int, default=32, help="sequences per screen input (default 32)")
    ap.add_argument("--out", default="results/development")
    ap.add_argument("--force", action="store_true", help="replace result files that already exist")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.steps < 1 or ns.n < 2:
        raise ValueError(f"--steps must be >= 1 and --n >= 2, got --steps {ns.steps} --n {ns.n}")
    out = Path(ns.out)
    check_outputs([out / "report.html", *(out / f"{t}.csv" for t in TABLES)], force=ns.force)
    t0 = time.time()
    torch.set_num_threads(1)
    source = Path(ns.series) if ns.series else build_local_series(out / "runs" / "local-series", steps=ns.steps,
                                                                    progress=not ns.quiet)
    tables = run(source, out, n=ns.n, progress=not ns.quiet)
    frac = tables["class_fractions"]
    print(frac.pivot(index="step", columns="class", values="count").to_string())
    print(f"\n{out}/report.html and {len(tables)} tables ({time.time() - t0:.0f} s)")
    return 0
