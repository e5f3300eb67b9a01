"""The pipelines behind the ``circuitfade`` subcommands and their command lines.

A layer above :mod:`circuitfade.viz` (which draws finished results and never computes them)
and below :mod:`circuitfade.cli` (which dispatches to these):

* :mod:`circuitfade.commands.boundary`: the command-line boundary every subcommand and every
  study's command shares (one-line errors in the command's own flags, exit codes, the
  checkpoint-finding flags of ``analyze`` and ``screen``);
* :mod:`circuitfade.commands.analyze`: ``circuitfade analyze`` (attach, trace, consolidation
  timeline, gate interventions, the HTML report of :mod:`circuitfade.viz.report`);
* :mod:`circuitfade.commands.screen`: ``circuitfade screen`` (the developmental screens of a
  revision series, the HTML report of :mod:`circuitfade.viz.screens`).

Importing this package imports nothing else (``circuitfade --help`` stays quick).
"""
