import sys

from circuitfade.cli import main

sys.exit(main())
