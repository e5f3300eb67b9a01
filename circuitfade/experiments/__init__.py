"""The papers' protocols, composed from the layers below (sweeps, training, analysis).

``circuitfade reproduce`` (:mod:`circuitfade.experiments.reproduce`) runs the main
paper's experiments; :mod:`circuitfade.experiments.paper` holds their configs and
table builders.
"""
