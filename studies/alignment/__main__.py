import sys

from studies.alignment.report import main
from studies.common import study_main

sys.exit(study_main("python -m studies.alignment", main))
