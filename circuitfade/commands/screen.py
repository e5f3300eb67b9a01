"""``circuitfade screen SERIES``: the developmental screens of a revision series.

"When do attention circuits form across model revisions" screens every attention head of
Pythia / OLMo at log-spaced revisions. This module runs that protocol on any series
(with no download, on the local developing series of :mod:`circuitfade.train.recipes`):

* :func:`run` attaches a series (a run directory, a folder of Hugging Face model
  folders, a folder of state dicts, or a :class:`~circuitfade.store.CheckpointSeries`),
  checks its integrity, screens every revision
  (:func:`~circuitfade.analysis.development.screen_series`), computes the series-level
  tables and writes an HTML report (:func:`circuitfade.viz.screens.report_html`: class
  fractions over steps, per-revision heatmaps of induction selectivity with a slider, PR
  timelines with the selectivity crossing marked) plus one CSV per table;
* :func:`main` is the command line ``circuitfade screen SERIES [--out report.html]
  [--bos ID] [--n N]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from circuitfade.analysis.development import (
    class_fractions,
    convergence_summary,
    emergence_shape,
    layer_counts,
    pr_lead_test,
    screen_series,
    set_convergence,
    zero_layers,
)
from circuitfade.analysis.screens import DEFAULT_THRESHOLDS, SCORES
from circuitfade.commands.boundary import (Parser, add_source_arguments, flag_names, guarded, removing_new_folders,
                                           source_from_args)
from circuitfade.io import check_outputs, default_output_dir, write_csv, write_text
from circuitfade.store import CheckpointSeries, attach
from circuitfade.store.revisions import sound_revisions
from circuitfade.viz.screens import report_html, wide_fractions

__all__ = ["run", "check_screen_arguments", "TABLES", "build_parser", "main"]

# --------------------------------------------------------------------------------------
# the protocol
# --------------------------------------------------------------------------------------
def _series(source) -> CheckpointSeries:
    return source if isinstance(source, CheckpointSeries) else attach(source)


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    full = [f for f in frames if len(f)]
    return pd.concat(full, ignore_index=True) if full else frames[0]


def check_screen_arguments(*, n, seq_len=None, bos=None, seed=0) -> None:
    """``ValueError`` naming the first bad one of :func:`run`'s ``n`` (an integer >= 1),
    ``seq_len`` (``None`` or an integer >= 1), ``bos`` (``None`` or a token id >= 0) and ``seed``
    (an integer >= 0); :func:`run` calls it before attaching or screening anything."""
    for name, v, minimum, optional in (("n", n, 1, False), ("seq_len", seq_len, 1, True), ("bos", bos, 0, True),
                                       ("seed", seed, 0, False)):
        if v is None and optional:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {v!r}")


TABLES = ("integrity", "screen", "class_fractions", "emergence_shape", "layer_counts", "zero_layers",
          "set_convergence", "convergence_summary", "pr_lead", "pr_lead_all")
"""The tables :func:`run` returns and writes as ``<name>.csv``."""


def run(
    series_or_run_dir,
    out: str | Path | None = None,
    *,
    n: int = 32,
    seq_len: int | None = None,
    bos: int | None = None,
    seed: int = 0,
    thresholds: Mapping[str, float] | None = None,
    jaccard_threshold: float = 0.8,
    html_name: str = "report.html",
    progress: bool = True,
) -> dict[str, pd.DataFrame]:
    """Screen every revision of a series and compute the series-level tables.

    Steps: attach (unless given a series), :func:`~circuitfade.store.revisions.sound_revisions`
    (duplicate and unreadable revisions left out with a warning),
    :func:`~circuitfade.analysis.development.screen_series`, then the tables. Returns ``{"integrity",
    "screen", "class_fractions", "emergence_shape", "layer_counts", "zero_layers", "set_convergence",
    "convergence_summary", "pr_lead", "pr_lead_all"}`` (``pr_lead``: the final induction
    heads; ``pr_lead_all``: the same test for the final heads of every class). With
    ``out`` (a folder), writes
    ``out/<html_name>`` and ``out/<table>.csv`` for each table.
    """
    check_screen_arguments(n=n, seq_len=seq_len, bos=bos, seed=seed)  # before any work or progress bar
    series, integrity = sound_revisions(_series(series_or_run_dir))
    screen = screen_series(series, n=n, seq_len=seq_len, bos=bos, seed=seed, thresholds=thresholds,
                           progress=progress).table
    fractions = class_fractions(screen)
    counts = layer_counts(screen)
    conv = set_convergence(screen, jaccard_threshold=jaccard_threshold)
    tables = {
        "integrity": integrity,
        "screen": screen,
        "class_fractions": fractions,
        "emergence_shape": emergence_shape(fractions),
        "layer_counts": counts,
        "zero_layers": zero_layers(counts),
        "set_convergence": conv,
        "convergence_summary": convergence_summary(conv),
        "pr_lead": pr_lead_test(screen),
        "pr_lead_all": _concat([pr_lead_test(screen, cls=c) for c in SCORES]),
    }
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            write_csv(out / f"{name}.csv", df)
        meta = {"source": str(series.source), "n": n, "bos": bos if bos is not None else
                getattr(series.task, "bos_token", None), "thresholds": {**DEFAULT_THRESHOLDS, **(thresholds or {})}}
        write_text(out / html_name, report_html(tables, meta=meta))
    return tables


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------
def build_parser(prog: str = "circuitfade screen") -> argparse.ArgumentParser:
    """The ``circuitfade screen`` parser: the screen's options and the checkpoint-finding group it
    shares with ``circuitfade analyze`` (:func:`~circuitfade.commands.boundary.add_source_arguments`)."""
    ap = Parser(
        prog=prog,
        description="Screen every attention head of every revision of a checkpoint series (induction, "
                    "previous-token, BOS-attractor classes; head-output PR), print the series-level tables and "
                    "write an HTML report.",
    )
    ap.add_argument("series", metavar="SERIES",
                    help="a circuitfade run directory, a folder of Hugging Face model folders (step1000/, ...), "
                         "or a folder of state-dict files with config.json")
    ap.add_argument("--out", metavar="FILE",
                    help="HTML report (default reports/<SERIES name>-screen/screen.html); tables go next to it as CSV")
    ap.add_argument("--force", action="store_true", help="replace output files that already exist")
    ap.add_argument("--bos", type=int, metavar="ID", help="BOS token id (default: the run task's, else none)")
    ap.add_argument("--n", type=int, default=32, help="sequences per screen input (default 32)")
    ap.add_argument("--seq-len", type=int, metavar="L", help="half-length of the repeated input (default: auto)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the screen inputs (default 0)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    add_source_arguments(ap, "SERIES")
    return ap


def _print(title: str, df: pd.DataFrame) -> None:
    print(f"\n## {title}")
    print(df.to_string(index=False, na_rep="NA", float_format=lambda v: f"{v:.3g}") if len(df) else "(none)")


def main(argv: list[str] | None = None) -> int:
    """``circuitfade screen SERIES [--out report.html] [--bos ID] [--n N] ...``: exit 0, 2 on bad input
    (one line in the command's flags, :func:`~circuitfade.commands.boundary.guarded`; folders the command
    created are removed again), 130 on Ctrl-C."""
    ap = build_parser()
    ns = ap.parse_args(sys.argv[1:] if argv is None else argv)
    return guarded(ap.prog, _screen_command, ns, resume=None, flags=flag_names(ap), also=(KeyError,))


def _screen_command(ns: argparse.Namespace) -> int:
    source = Path(ns.series)
    out = Path(ns.out) if ns.out else default_output_dir(source, "screen") / "screen.html"
    t0 = time.time()
    check_screen_arguments(n=ns.n, seq_len=ns.seq_len, bos=ns.bos, seed=ns.seed)  # before any progress bar
    with removing_new_folders(out.parent):
        check_outputs([out, *(out.parent / f"{name}.csv" for name in TABLES)], force=ns.force)
        series = source_from_args(ns, source)
        tables = run(series, out.parent, n=ns.n, seq_len=ns.seq_len, bos=ns.bos, seed=ns.seed, html_name=out.name,
                     progress=not ns.quiet)
    _print("Integrity", tables["integrity"][["step", "source", "status"]])
    _print("Class fractions", wide_fractions(tables["class_fractions"]))
    _print("Emergence shape", tables["emergence_shape"])
    zero = tables["zero_layers"]
    _print("Layers with no head of a class at any revision", zero[zero["zero_at_every_revision"]])
    _print("Induction-set convergence", tables["convergence_summary"])
    _print("PR lead test (final induction heads)", tables["pr_lead"])
    print(f"\nreport: {out}  (tables: {out.parent}/*.csv; {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
