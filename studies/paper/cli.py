"""``python -m studies.paper {reproduce,static}``: the two commands of the paper study."""

import sys

from studies.paper import reproduce, static_baselines

__all__ = ["COMMANDS", "main"]

COMMANDS = {"reproduce": ("run the main paper's experiments, write results/paper/results.md", reproduce.main),
            "static": ("static baselines (13 methods) and removability of published priors", static_baselines.main)}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        asked = not argv or argv[0] in ("-h", "--help")
        stream = sys.stdout if asked else sys.stderr
        print("usage: python -m studies.paper {reproduce,static} [--help]\n", file=stream)
        for name, (text, _) in COMMANDS.items():
            print(f"  {name:<10} {text}", file=stream)
        return 0 if asked else 2
    return COMMANDS[argv[0]][1](argv[1:])
