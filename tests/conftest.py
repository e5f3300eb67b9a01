"""The test folders, laid out like the code:

* ``library/``: the package's tests, grouped like it: ``model/`` (model, gating, tasks), ``train/``,
  ``store/``, ``analysis/``, ``commands/`` (the command line and the figures it draws), ``stats/``
  (statistics and claims), ``structure/`` (layering and the shape of the code base);
* ``studies/``: the tests of the research protocols in ``studies/`` (their rules, declarations,
  outputs and committed findings);
* ``docs/``: the README, every docs page and the tutorials;
* ``tl4/``: the line-specific and line-equivalence tests (marker ``tl4``).

Here sit the helpers the test files share (``planted``, ``planted_jobs``, ``tolerances``, and
``repo_root`` for the repository's path). This file puts ``tests/``, every folder under it that holds
test files, and the repository root (the ``studies`` package beside the library) on ``sys.path``,
whichever way pytest is started, so ``from planted import CopyTask`` and a test file's imports from
another (``from test_ensemble import ...``) work from any folder. The folders are no packages: each
test file's name is unique across them."""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
sys.path.insert(1, str(TESTS.parent))
for i, folder in enumerate(sorted({p.parent for p in TESTS.rglob("test_*.py")} - {TESTS}), start=2):
    sys.path.insert(i, str(folder))

import os  # noqa: E402
import tempfile  # noqa: E402

# The executor calibration (circuitfade.train.calibrate) caches what it measured per machine. Tests must not read a
# cache the user's machine wrote (its choice would decide what a test sees) nor write into it: each test process
# gets an empty cache of its own. A test that needs one executor names it.
os.environ.setdefault("CIRCUITFADE_CACHE", tempfile.mkdtemp(prefix="circuitfade-test-cache-"))


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run first (otherwise in collection order): a worker of ``pytest -n`` that picks up a
    minute-long test near the end leaves the others idle; started first, the short tests fill in around it."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
