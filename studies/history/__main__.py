import sys

from studies.common import study_main
from studies.history.study import main

sys.exit(study_main("python -m studies.history", main))
