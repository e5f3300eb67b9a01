import sys

from studies.common import study_main
from studies.paper.cli import main

sys.exit(study_main("python -m studies.paper", main))
