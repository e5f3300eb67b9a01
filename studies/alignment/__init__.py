"""No-partial-credit circuit formation: ``python -m studies.alignment [EXPERIMENT ...]``.

The study ("a capability appears in a language model when the last parts of its circuit align
in one stochastic attempt, and getting all but one right is worth nothing") tested on the
K-part apparatus of :mod:`circuitfade.tasks.kpart`. Modules: :mod:`.apparatus` (the fixed
settings and job runner), :mod:`.parts` (part ablation, waiting times, the rate equation),
:mod:`.cure`, :mod:`.ignition`, :mod:`.precursor`, :mod:`.occupation`, :mod:`.anneal`,
:mod:`.fdt`, and :mod:`.report` (the command and ``results/alignment/results.md``).
"""
