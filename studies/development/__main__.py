import sys

from studies.common import study_main
from studies.development.study import main

sys.exit(study_main("python -m studies.development", main))
