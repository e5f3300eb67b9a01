"""What every benchmark writes: its figures as JSON under ``results/benchmarks/`` and, beside it,
the markdown the docs include, each with the command line that made it."""

from __future__ import annotations

import sys
from pathlib import Path


def command_line(script: str, argv: list[str] | None) -> str:
    """``python benchmarks/<script's name> ARGS`` as typed (``argv=None``: this process's arguments)."""
    args = argv if argv is not None else sys.argv[1:]
    return f"python benchmarks/{Path(script).name} {' '.join(args)}".strip()


def write_outputs(out: str | Path, result: dict, markdown: str) -> None:
    """``out`` (JSON) and the markdown beside it (same name, ``.md``), atomically."""
    from circuitfade.io import write_json, write_text

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    write_text(out.with_suffix(".md"), markdown)
    print(f"wrote {out} and {out.with_suffix('.md').name}")
