"""Edge circuits at gate zero and while the gate was on: ``python -m studies.circuits``
(see :mod:`studies.circuits.study`)."""
import sys

from studies.common import study_main
from studies.circuits.study import main

if __name__ == "__main__":
    sys.exit(study_main("python -m studies.circuits", main))
