"""Wall time of ``circuitfade --help`` against ``python -c pass``, side by side in one run.

The command's parser is built without importing torch, TransformerLens or pandas (each
subcommand imports what it needs when it runs), so ``--help`` costs little more than
starting Python. The two commands are timed in alternation (A B A B ...), each as a whole
process, and the medians and their ratio are printed, next to the target (< 2 s).

    python benchmarks/cli_help.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ns = ap.parse_args(argv)
    if ns.rounds < 1:
        ap.error("--rounds must be >= 1")
    cmds = {"circuitfade --help": [sys.executable, "-m", "circuitfade", "--help"],
            "python -c pass": [sys.executable, "-c", "pass"]}
    for cmd in cmds.values():  # warm-up: the file cache
        wall(cmd)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(ns.rounds):
        for name, cmd in cmds.items():
            times[name].append(wall(cmd))
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, m in med.items():
        print(f"{name:<20} median {m:.3f} s  (min {min(times[name]):.3f}, max {max(times[name]):.3f}, "
              f"{ns.rounds} rounds)")
    print(f"ratio circuitfade --help / python -c pass: {med['circuitfade --help'] / med['python -c pass']:.2f}x; "
          f"target: circuitfade --help < 2 s -> {'met' if med['circuitfade --help'] < 2 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
