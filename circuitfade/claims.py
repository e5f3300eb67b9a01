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
* :class:`Provenance` - when a claim's rule was written relative to its results (declared
  before the runs, declared after the results, restated after the results, not declared); a
  verdict also states the seeds its arms ran on against the seeds declared
  (:meth:`Verdict.checked_seeds`: a claim short of them is "not run (k of n seeds)").
* :class:`Declaration` - a study's scan grids, seed counts, arms and rules as data, with a
  content hash that results record (:meth:`Declaration.sha256`): changing a declaration after
  results exist means a new version, never an edit.

Interval rules are three-valued: ``True`` when the whole interval satisfies the bound,
``False`` when the whole interval violates it, ``None`` (undecided) when it straddles it
or is NaN. They share the input contract of :mod:`circuitfade.stats`: an inverted interval,
an infinite bound or a non-number is a ``ValueError``; decisions are Python or numpy booleans
or ``None`` (anything else is refused), and an empty :func:`all_of` / :func:`any_of` is ``None``.
:func:`grade` maps (full, partial) to an outcome:

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

import numpy as np
import pandas as pd

from circuitfade import stats
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
def _rule_input(lo, hi, bound, fn: str) -> tuple[float, float, float]:
    """An interval (NaN or ``None`` ends: unknown; ±inf: unbounded; inverted: refused) and a
    threshold (a real number, NaN: unknown; ±inf refused), checked by :mod:`circuitfade.stats`."""
    lo, hi = stats.check_interval(lo, hi, f"{fn}: interval")
    return lo, hi, stats.check_number(bound, f"{fn}: bound")


def at_most(lo: float, hi: float, bound: float) -> bool | None:
    """``x <= bound`` for an interval ``[lo, hi]`` of x: True if ``hi <= bound``, False if
    ``lo > bound``, None (undecided) otherwise or when an end or the bound is NaN or ``None``.
    ``ValueError`` for an inverted interval (``lo > hi``), an infinite bound or a non-number."""
    lo, hi, bound = _rule_input(lo, hi, bound, "at_most")
    if math.isnan(lo) or math.isnan(hi) or math.isnan(bound):
        return None
    return True if hi <= bound else (False if lo > bound else None)


def at_least(lo: float, hi: float, bound: float) -> bool | None:
    """``x >= bound`` for an interval ``[lo, hi]`` of x: True if ``lo >= bound``, False if
    ``hi < bound``, None otherwise or when an end or the bound is NaN or ``None`` (the same
    input contract as :func:`at_most`)."""
    lo, hi, bound = _rule_input(lo, hi, bound, "at_least")
    if math.isnan(lo) or math.isnan(hi) or math.isnan(bound):
        return None
    return True if lo >= bound else (False if hi < bound else None)


def _decision(x, name: str) -> bool | None:
    """A three-valued decision: ``True``, ``False`` (Python or numpy booleans, 0-d boolean arrays
    included) or ``None`` (undecided); anything else is a ``ValueError`` naming ``name``."""
    if x is None:
        return None
    if isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype == np.bool_:
        x = x.item()
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise ValueError(f"{name}: expected a decision True, False or None, got {x!r}")


def all_of(*xs: bool | None) -> bool | None:
    """Three-valued AND: False if any is False, True if all are True, else None. With no
    arguments: None (an empty conjunction decides nothing, so it never makes a rule hold)."""
    ds = [_decision(x, f"all_of: argument {i}") for i, x in enumerate(xs)]
    if any(d is False for d in ds):
        return False
    return True if ds and all(d is True for d in ds) else None


def any_of(*xs: bool | None) -> bool | None:
    """Three-valued OR: True if any is True, False if all are False, else None (also with no
    arguments)."""
    ds = [_decision(x, f"any_of: argument {i}") for i, x in enumerate(xs)]
    if any(d is True for d in ds):
        return True
    return False if ds and all(d is False for d in ds) else None


def grade(full: bool | None, part: bool | None, *, have: bool = True, testable: bool = True) -> Outcome:
    """The outcome of a claim from its full and partial rule (table in the module docstring).

    ``full``/``part``: three-valued decisions (Python or numpy booleans, or ``None``);
    ``have=False``: the claim's runs do not exist (NOT_RUN); ``testable=False``: they exist but
    cannot speak to the claim (e.g. no run left the initial plateau: NOT_TESTABLE). Anything
    else (a number, a string, a list of decisions) is a ``ValueError``.
    """
    full, part = _decision(full, "grade: full"), _decision(part, "grade: part")
    have, testable = _decision(have, "grade: have"), _decision(testable, "grade: testable")
    if have is None or testable is None:
        raise ValueError(f"grade: have and testable must be True or False, got have={have!r}, testable={testable!r}")
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
    run, declared = stats.check_count(run, "seeds_cell: run"), stats.check_count(declared, "seeds_cell: declared")
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
        if not isinstance(self.name, str) or not isinstance(self.rule, str) or not self.name or not self.rule:
            raise ValueError(f"Claim needs a name and a rule, got name={self.name!r}, rule={self.rule!r}")
        for field_name in ("study", "statistic", "fails_if"):
            if not isinstance(getattr(self, field_name), str):
                raise ValueError(f"Claim.{field_name} must be a string, got {getattr(self, field_name)!r}")


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
class _FrozenDict(dict):
    """A ``dict`` that refuses every change: a declaration's data after it is declared. Reads,
    ``==``, ``dict(...)``, ``{**d}`` and JSON work as for a ``dict`` (so the hash is unchanged)."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("a Declaration's data cannot change; declare a new version instead")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):  # a copy or a pickle is plain data (loadable without this module)
        return (dict, (dict(self),))


class _FrozenList(list):
    """A ``list`` that refuses every change (see :class:`_FrozenDict`)."""

    _refuse = _FrozenDict._refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = clear = extend = insert = pop = remove = _refuse
    reverse = sort = _refuse

    def __reduce__(self):
        return (list, (list(self),))


def _freeze(x: Any, where: str) -> Any:
    """A deep, frozen copy of JSON data (dicts, lists, tuples, strings, numbers, booleans, None)."""
    if isinstance(x, Mapping):
        for k in x:
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise ValueError(f"Declaration.data: key {k!r} at {where} is not a JSON key")
        return _FrozenDict({k: _freeze(v, f"{where}.{k}") for k, v in x.items()})
    if isinstance(x, list):
        return _FrozenList(_freeze(v, f"{where}[{i}]") for i, v in enumerate(x))
    if isinstance(x, tuple):
        return tuple(_freeze(v, f"{where}[{i}]") for i, v in enumerate(x))
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    raise ValueError(f"Declaration.data: {where} holds {x!r}, which is not JSON data")


def _thaw(x: Any) -> Any:
    """Plain ``dict``/``list`` copies of frozen data (tuples stay tuples: JSON writes both as lists)."""
    if isinstance(x, Mapping):
        return {k: _thaw(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_thaw(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_thaw(v) for v in x)
    return x


@dataclass(frozen=True)
class Declaration:
    """A study's protocol fixed before its runs: scans, seeds, arms, rules (any JSON data).

    ``name`` and ``version`` identify it; :meth:`sha256` hashes the whole declaration
    (canonical JSON), so a results file that records the hash says exactly which protocol
    produced it. The data is deep-copied and frozen when declared: changing the dict it was
    built from changes nothing, and changing ``data`` (at any depth) raises ``TypeError``; a
    change is a new ``version``. ``ValueError`` for an empty name, a version that is not a
    positive integer, or data that is not a mapping of JSON values.
    """

    name: str
    version: int
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Declaration.name must be a non-empty string, got {self.name!r}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"Declaration.version must be a positive integer, got {self.version!r}")
        if not isinstance(self.data, Mapping):
            raise ValueError(f"Declaration.data must be a mapping, got {type(self.data).__name__}")
        object.__setattr__(self, "data", _freeze(self.data, "data"))

    def __reduce__(self):  # a copy or an unpickled declaration is declared again: frozen
        return (Declaration, (self.name, self.version, _thaw(self.data)))

    def payload(self) -> dict:
        """``{"name", "version", "data"}`` as plain (unfrozen) JSON data: what :meth:`sha256` hashes."""
        return {"name": self.name, "version": self.version, "data": _thaw(self.data)}

    def sha256(self) -> str:
        return content_hash(self.payload())

    def stamp(self) -> str:
        """``"<name> v<version> (sha256 <first 12 hex>)"``, for result files."""
        return f"{self.name} v{self.version} (sha256 {self.sha256()[:12]})"
