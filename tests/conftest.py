"""Makes ``tests/`` importable (``from planted import CopyTask``) for every test file,
including those in ``tests/tl4/`` that the TransformerLens-4 environment runs, and the
repository root (the ``studies`` package beside the library), whichever way pytest is started."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import os  # noqa: E402
import tempfile  # noqa: E402

# The executor calibration (circuitfade.train.calibrate) caches what it measured per machine. Tests must not read a
# cache the user's machine wrote (its choice would decide what a test sees) nor write into it: each test process
# gets an empty cache of its own. A test that needs one executor names it.
os.environ.setdefault("CIRCUITFADE_CACHE", tempfile.mkdtemp(prefix="circuitfade-test-cache-"))
