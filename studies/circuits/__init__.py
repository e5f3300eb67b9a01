"""Does the edge circuit at gate zero come from the gate-on phase? ``python -m studies.circuits``.

Modules: :mod:`.declaration` (the protocol, fixed before the runs), :mod:`.study` (runs, trace,
tables, verdicts).
"""
