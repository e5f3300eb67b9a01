"""Pre-registered claims: what a study tests, by which rule, and what would make it fail.

A reproduction is only worth something if it could have failed. This module is the one
place where that is written down, for the studies beside the package and for a user's
own study:

* :class:`Claim` - one claim, declared *before* its runs: the statistic, the rule (fixed
  in code), the published value it is compared with, and the data that would make it fail.
* :class:`Outcome` - the only verdict words: reproduced, partly, not reproduced,
  inconclusive, not testable, not run, forced by the apparatus.
* three-valued interval rules (:func:`at_least`, :func:`at_most`, :func:`all_of`,
  :func:`any_of`) and :func:`grade`, which turns a full rule and a partial rule into an
  :class:`Outcome`.
* :class:`Verdict` (a claim, our value, its outcome) and :func:`verdict_table`, the one
  table builder every study uses.
* :class:`Declaration` - a study's scan grids, seed counts, arms and rules as data, with a
  content hash that results record (:meth:`Declaration.sha256`): changing a declaration after
  results exist means a new version, never an edit.

Interval rules are three-valued: ``True`` when the whole interval satisfies the bound,
``False`` when the whole interval violates it, ``None`` (undecided) when it straddles it
or is NaN. :func:`grade` maps (full, partial) to an outcome:

=========================  ==========================  ====================
full rule                  partial rule                outcome
=========================  ==========================  ====================
True                       any                         reproduced
False or None              True                        partly
False                      False                       not reproduced
otherwise                                              inconclusive
=========================  ==========================  ====================

Example (a claim "the fade keeps at least 0.6 zero-gate accuracy", 3 seeds)::

    from circuitfade import stats
    from circuitfade.claims import Claim, Verdict, at_least, grade, verdict_table

    claim = Claim("fade keeps retrieval at zero gate", statistic="zero-gate accuracy, mean over seeds",
                  rule="95% t interval >= 0.60 (partly: mean >= 0.60)", study=".734",
                  fails_if="the interval lies below 0.60")
    mean, lo, hi = stats.t_interval([0.71, 0.75, 0.69])
    outcome = grade(at_least(lo, hi, 0.60), mean >= 0.60)
    table = verdict_table([Verdict(claim, f"{mean:.3f} [{lo:.3f}, {hi:.3f}]", outcome)])
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from circuitfade.io import content_hash

__all__ = ["Outcome", "Claim", "Verdict", "Declaration", "at_least", "at_most", "all_of", "any_of", "grade",
           "verdict_table", "VERDICT_COLUMNS", "Provenance", "PROVENANCE_COLUMNS", "seeds_cell"]

Decision = "bool | None"


class Outcome(str, enum.Enum):
    """A claim's verdict. The value is the word written in tables (``str(outcome)``)."""

    REPRODUCED = "reproduced"
    PARTLY = "partly"
    NOT_REPRODUCED = "not reproduced"
    INCONCLUSIVE = "inconclusive"
    NOT_TESTABLE = "not testable"
    NOT_RUN = "not run"
    FORCED = "forced by the apparatus"  # the outcome holds in any model of the apparatus: it tests nothing

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, word: str) -> "Outcome":
        """The outcome whose word starts ``word`` (``"partly (full rule undecided)"`` -> PARTLY)."""
        for o in sorted(cls, key=lambda o: -len(o.value)):
            if str(word).startswith(o.value):
                return o
        raise ValueError(f"not a verdict word: {word!r}; expected one of {[o.value for o in cls]}")


# ----------------------------------------------------------------------------- interval rules
def _nan(*xs: float) -> bool:
    return any(x is None or (isinstance(x, float) and math.isnan(x)) for x in xs)


def at_most(lo: float, hi: float, bound: float) -> bool | None:
    """``x <= bound`` for an interval ``[lo, hi]`` of x: True if ``hi <= bound``, False if
    ``lo > bound``, None (undecided) otherwise or when an end is NaN."""
    if _nan(lo, hi):
        return None
    return True if hi <= bound else (False if lo > bound else None)


def at_least(lo: float, hi: float, bound: float) -> bool | None:
    """``x >= bound`` for an interval ``[lo, hi]`` of x: True if ``lo >= bound``, False if
    ``hi < bound``, None otherwise."""
    return at_most(-hi, -lo, -bound)


def all_of(*xs: bool | None) -> bool | None:
    """Three-valued AND: False if any is False, True if all are True, else None."""
    if any(x is False for x in xs):
        return False
    return True if all(x is True for x in xs) else None


def any_of(*xs: bool | None) -> bool | None:
    """Three-valued OR: True if any is True, False if all are False, else None."""
    if any(x is True for x in xs):
        return True
    return False if all(x is False for x in xs) else None


def grade(full: bool | None, part: bool | None, *, have: bool = True, testable: bool = True) -> Outcome:
    """The outcome of a claim from its full and partial rule (table in the module docstring).

    ``have=False``: the claim's runs do not exist (NOT_RUN); ``testable=False``: they exist but
    cannot speak to the claim (e.g. no run left the initial plateau: NOT_TESTABLE).
    """
    if not have:
        return Outcome.NOT_RUN
    if not testable:
        return Outcome.NOT_TESTABLE
    if full is True:
        return Outcome.REPRODUCED
    if part is True:
        return Outcome.PARTLY
    if full is False and part is False:
        return Outcome.NOT_REPRODUCED
    return Outcome.INCONCLUSIVE


# ----------------------------------------------------------------------------- provenance
class Provenance(str, enum.Enum):
    """When a claim's rule was fixed, relative to the results it grades (the words written in
    verdict tables). Only ``DECLARED_BEFORE`` makes a verdict a test that could have failed
    unseen; the others say that the rule was written, or changed, with the results in view."""

    DECLARED_BEFORE = "declared before the runs"
    DECLARED_AFTER = "declared after the results"
    RESTATED = "restated after the results"
    NOT_DECLARED = "not declared"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, word: str) -> "Provenance":
        """The provenance whose word is ``word``; ``ValueError`` for any other word."""
        for p in cls:
            if str(word) == p.value:
                return p
        raise ValueError(f"not a provenance word: {word!r}; expected one of {[p.value for p in cls]}")


def seeds_cell(run: int | None, declared: int | None) -> str:
    """``"1 of 3"``: the seeds a claim's arms were run on (the fewest over its arms) against the
    seeds declared; ``"—"`` when either is unknown."""
    if run is None or declared is None:
        return "—"
    for name, x in (("run", run), ("declared", declared)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"seeds_cell: {name} must be a non-negative integer, got {x!r}")
    return f"{run} of {declared}"


# ----------------------------------------------------------------------------- claims and verdicts
@dataclass(frozen=True)
class Claim:
    """One claim, declared before its runs.

    ``name``: what is claimed; ``statistic``: what is measured; ``rule``: the rule in words,
    as the code applies it (full rule, and the partial rule in parentheses); ``study``: the
    published value it is compared with; ``fails_if``: the data that would make it fail
    (a claim without one is not a test).
    """

    name: str
    rule: str
    study: str = ""
    statistic: str = ""
    fails_if: str = ""

    def __post_init__(self):
        if not self.name or not self.rule:
            raise ValueError(f"Claim needs a name and a rule, got name={self.name!r}, rule={self.rule!r}")


@dataclass(frozen=True)
class Verdict:
    """A claim judged: our value (formatted, with its interval) and the outcome."""

    claim: Claim
    ours: str
    outcome: Outcome
    note: str = ""  # appended to the verdict word, e.g. "(full rule undecided)"
    provenance: Provenance | None = None  # when the rule was fixed relative to the results
    seeds_run: int | None = None  # the fewest seeds any of the claim's arms was run on
    seeds_declared: int | None = None  # the seeds the declaration asks for

    def __post_init__(self):
        if not isinstance(self.outcome, Outcome):
            raise TypeError(f"Verdict.outcome must be an Outcome, got {self.outcome!r}")

    @property
    def word(self) -> str:
        return f"{self.outcome} {self.note}".strip()

    @classmethod
    def not_run(cls, claim: Claim) -> "Verdict":
        return cls(claim, "—", Outcome.NOT_RUN)

    @property
    def short_of_seeds(self) -> bool:
        """True when the claim's arms ran on fewer seeds than declared."""
        return self.seeds_run is not None and self.seeds_declared is not None and self.seeds_run < self.seeds_declared

    def checked_seeds(self) -> "Verdict":
        """This verdict, or, when its arms ran on fewer seeds than declared, the same row graded
        "not run (k of n seeds)": a claim graded on fewer seeds than its declaration asks for has
        not been run as declared, whatever its rule would say on those seeds."""
        if not self.short_of_seeds:
            return self
        return Verdict(self.claim, self.ours, Outcome.NOT_RUN, f"({self.seeds_run} of {self.seeds_declared} seeds)",
                       self.provenance, self.seeds_run, self.seeds_declared)


VERDICT_COLUMNS = ("claim", "ours", "study", "rule", "verdict")
PROVENANCE_COLUMNS = ("seeds run", "provenance")
"""Added after ``verdict`` by :func:`verdict_table` when any verdict states its seeds or provenance."""


def verdict_table(verdicts: Sequence[Verdict], *, columns: Mapping[str, str] | None = None,
                  extra: Mapping[str, Sequence[Any]] | None = None) -> pd.DataFrame:
    """One row per verdict: ``claim, ours, study, rule, verdict`` (``verdict`` is the outcome word).

    ``columns`` renames columns (e.g. ``{"ours": "ours (95% interval)"}``); ``extra`` adds
    columns, one value per verdict, in the given order before ``verdict``. A verdict whose
    rule is "—" (not run) keeps it. When any verdict states its seeds or its provenance, two
    columns follow ``verdict`` (:data:`PROVENANCE_COLUMNS`): ``seeds run`` ("1 of 3", "—" when
    unknown) and ``provenance`` (a :class:`Provenance` word, "—" when not stated).
    """
    rows = []
    for v in verdicts:
        rows.append({"claim": v.claim.name, "ours": v.ours, "study": v.claim.study,
                     "rule": "—" if v.outcome is Outcome.NOT_RUN and v.ours == "—" else v.claim.rule,
                     "verdict": v.word})
    df = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    for name, values in (extra or {}).items():
        df.insert(len(df.columns) - 1, name, list(values))
    if any(v.provenance is not None or v.seeds_run is not None for v in verdicts):
        df[PROVENANCE_COLUMNS[0]] = [seeds_cell(v.seeds_run, v.seeds_declared) for v in verdicts]
        df[PROVENANCE_COLUMNS[1]] = ["—" if v.provenance is None else str(v.provenance) for v in verdicts]
    return df.rename(columns=dict(columns or {}))


# ----------------------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Declaration:
    """A study's protocol fixed before its runs: scans, seeds, arms, rules (any JSON data).

    ``name`` and ``version`` identify it; :meth:`sha256` hashes the whole declaration
    (canonical JSON), so a results file that records the hash says exactly which protocol
    produced it. Edit the data only by declaring a new ``version``.
    """

    name: str
    version: int
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"Declaration.version must be a positive integer, got {self.version!r}")

    def payload(self) -> dict:
        return {"name": self.name, "version": self.version, "data": dict(self.data)}

    def sha256(self) -> str:
        return content_hash(self.payload())

    def stamp(self) -> str:
        """``"<name> v<version> (sha256 <first 12 hex>)"``, for result files."""
        return f"{self.name} v{self.version} (sha256 {self.sha256()[:12]})"
