"""Wall time of the whole test suite at two commits, side by side on this machine.

Each commit is checked out into a temporary worktree and its suite run as ``make test`` runs it
(``pytest -q -n auto --maxprocesses 4 --dist loadgroup``) with this environment's Python and the
worktree first on ``PYTHONPATH``, so both trees use the same installed packages. The runs
alternate (base, this tree, base, ...) for ``--rounds`` rounds; reported: each run's wall time and
its closing line (passed / failed / skipped), the median per tree and the ratio. A test failing in
either tree is counted, not hidden; the ratio compares time, and the counts say what was run.

    python benchmarks/suite_time.py --base REV [--head HEAD] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_files import command_line, write_outputs

REPO = Path(__file__).resolve().parents[1]
CLOSING = re.compile(r"^=*\s*(?P<line>(?:\d+ (?:passed|failed|skipped|xfailed|xpassed|errors?|warnings?),? ?)+)")


def _worktree(rev: str, where: Path) -> str:
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(where), rev], check=True)
    return subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def _counts(output: str) -> dict[str, int]:
    last = [m.group("line") for m in map(CLOSING.match, output.splitlines()) if m]
    out: dict[str, int] = {}
    for n, kind in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed|errors?)", last[-1] if last else ""):
        out[kind.rstrip("s") if kind.startswith("error") else kind] = int(n)
    return out


def run_suite(tree: Path, cache: Path) -> dict:
    """The suite of ``tree`` once: wall seconds and the closing counts."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CIRCUITFADE_CACHE": str(cache)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto", "--maxprocesses", "4",
                           "--dist", "loadgroup", "-p", "no:cacheprovider"], cwd=tree, env=env,
                          capture_output=True, text=True)
    return {"seconds": time.perf_counter() - t0, "exit": proc.returncode, **_counts(proc.stdout)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. the previous release)")
    ap.add_argument("--head", default="HEAD", help="this tree's commit (default HEAD)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each suite, alternating (default 1)")
    ap.add_argument("--out", help="JSON written with every figure, the markdown beside it "
                                  "(default results/benchmarks/suite_time.json)")
    args = ap.parse_args(argv)
    out = args.out or str(REPO / "results" / "benchmarks" / "suite_time.json")
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="circuitfade-suite-") as tmp:
        trees = {"base": Path(tmp) / "base", "head": Path(tmp) / "head"}
        shas = {"base": _worktree(args.base, trees["base"]), "head": _worktree(args.head, trees["head"])}
        try:
            for r in range(args.rounds):
                for name in ("base", "head"):
                    res = run_suite(trees[name], Path(tmp) / f"cache-{name}-{r}")
                    runs[name].append(res)
                    print(f"round {r + 1} {name} {shas[name]}: {res['seconds']:.0f} s, {res}", flush=True)
        finally:
            for t in trees.values():
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(t)], check=False)
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    result = {"command": command_line(__file__, argv), "base": shas["base"], "head": shas["head"],
              "runs": runs, "median_s": med, "head_over_base": med["head"] / med["base"]}
    print(f"median: base {med['base']:.0f} s, head {med['head']:.0f} s; head / base = {result['head_over_base']:.2f}")
    write_outputs(out, result, markdown(result))
    return result


def markdown(result: dict) -> str:
    def counts(r: dict) -> str:
        return ", ".join(f"{r[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed") if r.get(k))

    lines = [f"`{result['command']}`: the whole suite as `make test` runs it, the two trees alternating.", "",
             "| tree | commit | wall time per run | tests |", "|---|---|---|---|"]
    for name, label in (("base", "base"), ("head", "this tree")):
        rs = result["runs"][name]
        times = ", ".join(f"{r['seconds']:.0f} s" for r in rs)
        lines.append(f"| {label} | `{result[name]}` | {times} | {counts(rs[-1])} |")
    lines += ["", f"This tree's suite takes **{result['head_over_base']:.2f}×** the base's wall time (median of "
                  f"{len(result['runs']['head'])} run(s) each)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
