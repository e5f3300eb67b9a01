"""What every benchmark writes: its figures as JSON under ``results/benchmarks/`` and, beside it,
the markdown the docs include, each with the command line that made it."""

from __future__ import annotations

import sys
from pathlib import Path


def command_line(script: str, argv: list[str] | None) -> str:
    """``python benchmarks/<script's name> ARGS`` as typed (``argv=None``: this process's arguments)."""
    args = argv if argv is not None else sys.argv[1:]
    return f"python benchmarks/{Path(script).name} {' '.join(args)}".strip()


def machine_line(result: dict) -> str:
    """The markdown line naming the machine a result was measured on (``result["machine"]``)."""
    m = result.get("machine")
    if not m:
        return "Machine: not recorded (measured before the benchmarks recorded it); figures on another machine differ."
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['blas']}, {m['cpu_capability']} kernels)"
            f"{gpu}. Figures on another machine differ: rerun the command there.")


def with_machine_line(markdown: str, result: dict) -> str:
    """``markdown`` ending with :func:`machine_line` (the one way every benchmark page ends)."""
    return markdown.rstrip("\n") + "\n\n" + machine_line(result) + "\n"


def write_outputs(out: str | Path, result: dict, markdown: str) -> None:
    """``out`` (JSON) and the markdown beside it (same name, ``.md``), atomically. The JSON records the
    machine (:func:`circuitfade.model.devices.machine`) unless the result names one; the markdown ends with
    :func:`machine_line`."""
    from circuitfade.io import write_json, write_text
    from circuitfade.model.devices import machine

    result = {**result, "machine": result.get("machine") or machine()}
    markdown = with_machine_line(markdown, result)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    write_text(out.with_suffix(".md"), markdown)
    print(f"wrote {out} and {out.with_suffix('.md').name}")
