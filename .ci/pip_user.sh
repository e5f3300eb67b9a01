#!/usr/bin/env bash
# A pip user's first hour, on a fresh machine: a non-editable `pip install .` into a new virtual
# environment outside the repository, then, from another folder, the README's first analysis block
# and tutorials 01-02 (they must find the example series through the package, and leave nothing in
# the working folder's parent or in /tmp).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --upgrade pip
"$py" -m pip install -q torch==2.13.0
"$py" -m pip install -q "$repo" nbclient nbformat ipykernel
mkdir "$work/user"
cd "$work/user"
# the README's first analysis block: the first ```python block that attaches a series
"$py" - "$repo/README.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
block = next(b for b in blocks if "example_series" in b or "attach(" in b)
open("readme_block.py", "w").write(block)
PY
MPLBACKEND=Agg "$py" readme_block.py
"$py" - "$repo/tutorials" <<'PY'
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

for name in ("01_fade_vs_unforced.ipynb", "02_trace_series.ipynb"):
    nb = nbformat.read(Path(sys.argv[1]) / name, as_version=4)
    NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
    print(f"{name}: ran from {Path.cwd()}")
PY
"$py" -c "import circuitfade, pathlib; p = pathlib.Path(circuitfade.__file__); assert 'site-packages' in str(p), p; print('installed at', p.parent)"
echo "pip user check: passed"
