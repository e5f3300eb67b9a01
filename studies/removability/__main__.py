import sys

from studies.common import study_main
from studies.removability.map import main

sys.exit(study_main("python -m studies.removability", main))
