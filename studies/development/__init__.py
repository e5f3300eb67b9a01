"""Developmental screens: ``python -m studies.development``.

After "When Do Attention Circuits Form? Developmental Trajectories of Capability and
Attention-Sink Emergence Across Three 1B-Class Architectures": every attention head of every
revision of a series is screened for induction, previous-token and BOS-attractor behaviour, with
a head-output participation-ratio timeline. The study runs the library's screen
(:func:`circuitfade.commands.screen.run`) on the local developing series
(:func:`circuitfade.train.recipes.build_local_series`, trained here, no download) or on any
series given with ``--series`` (e.g. a folder of Pythia revisions), and writes
``results/development/`` as one unit (:mod:`studies.common`): a run that fails or is interrupted
leaves the previous results whole and keeps its own files aside, and the same command resumes
from them. Module: :mod:`.study`.
"""
