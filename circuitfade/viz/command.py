"""Moved: the command-line boundary every subcommand shares is :mod:`circuitfade.commands.boundary`
(a name asked for here raises an ``ImportError`` that names its new place)."""

from circuitfade.viz import moved_names

__getattr__ = moved_names(__name__, {"circuitfade.commands.boundary": (
    "MAX_ERROR_CHARS", "RESUME_HINT", "UsageError", "flag_names", "in_flags", "bounded", "error_line", "Parser",
    "guarded", "check_count", "removing_new_folders", "SOURCE_OPTIONS", "step_list", "add_source_arguments",
    "source_from_args")})
