"""Makes ``tests/`` importable (``from planted import CopyTask``) for every test file,
including those in ``tests/tl4/`` that the TransformerLens-4 environment runs."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
