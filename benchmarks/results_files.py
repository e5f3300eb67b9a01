"""What every benchmark writes: its figures as JSON under ``results/benchmarks/`` and, beside it,
the markdown the docs include, each with the command line that made it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def command_line(script: str, argv: list[str] | None) -> str:
    """``python benchmarks/<script's name> ARGS`` as typed (``argv=None``: this process's arguments)."""
    args = argv if argv is not None else sys.argv[1:]
    return f"python benchmarks/{Path(script).name} {' '.join(args)}".strip()


def code_version() -> str | None:
    """The commit of the code measured (short hash; ``+`` where tracked files differ from it), or
    ``None`` outside a git checkout."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_line(result: dict) -> str:
    """The markdown line naming the machine a result was measured on (``result["machine"]``) and the
    code measured (``result["code"]``, where recorded)."""
    m = result.get("machine")
    code = f" Code: `{result['code']}`." if result.get("code") else ""
    if not m:
        return ("Machine: not recorded (measured before the benchmarks recorded it); figures on another machine "
                f"differ.{code}")
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ""
    return (f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['blas']}, {m['cpu_capability']} kernels)"
            f"{gpu}.{code} Figures on another machine differ: rerun the command there.")


def with_machine_line(markdown: str, result: dict) -> str:
    """``markdown`` ending with :func:`machine_line` (the one way every benchmark page ends)."""
    return markdown.rstrip("\n") + "\n\n" + machine_line(result) + "\n"


def write_outputs(out: str | Path, result: dict, markdown: str) -> None:
    """``out`` (JSON) and the markdown beside it (same name, ``.md``), atomically. The JSON records the
    machine (:func:`circuitfade.model.devices.machine`) and the code (:func:`code_version`) unless the
    result names them; the markdown ends with :func:`machine_line`."""
    from circuitfade.io import write_json, write_text
    from circuitfade.model.devices import machine

    result = {**result, "machine": result.get("machine") or machine(), "code": result.get("code") or code_version()}
    markdown = with_machine_line(markdown, result)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    write_text(out.with_suffix(".md"), markdown)
    print(f"wrote {out} and {out.with_suffix('.md').name}")
