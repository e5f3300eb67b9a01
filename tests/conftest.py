"""Makes ``tests/`` importable (``from planted import CopyTask``) for every test file,
including those in ``tests/tl4/`` that the TransformerLens-4 environment runs, and the
repository root (the ``studies`` package beside the library), whichever way pytest is started."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
