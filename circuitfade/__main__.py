from circuitfade.cli import run

run()
