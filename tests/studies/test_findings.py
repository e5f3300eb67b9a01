"""Findings say exactly what the verdicts say.

Every outcome the README, the docs' front page and the study pages state is quoted as
``*WORD* (claim `STUDY/ID`)`` and checked here against that study's ``verdicts.csv``; outside
those quotes the summaries use no verdict words, so no hand-written outcome can drift from the
tables. Every verdict row states its provenance and the seeds it ran on; a claim short of its
declared seeds is never graded as if it had them.
"""

from __future__ import annotations

import re

import pandas as pd
import pytest

from circuitfade.claims import (PROVENANCE_COLUMNS, Claim, Outcome, Provenance, Verdict, seeds_cell,
                                verdict_table)
from repo_root import REPO


SOURCES = {  # claim prefix -> (verdicts file, verdict column)
    "paper": ("results/paper/verdicts.csv", "verdict"),
    "paper-large": ("results/paper/large/verdicts.csv", "verdict (large)"),
    "removability": ("results/removability/verdicts.csv", "verdict"),
    "history": ("results/history/verdicts.csv", "verdict"),
    "circuits": ("results/circuits/verdicts.csv", "verdict"),
}
"""Where each study's verdict rows are (one row per claim id)."""

QUOTE = re.compile(r"\*(?P<word>[^*\n]+)\*:?\s+\(claims?\s+(?P<ids>`[^`]+`(?:,\s+`[^`]+`)*)\)")
VERDICT_WORDS = re.compile(r"reproduc|\bpartly\b|inconclusive|not testable|\bnot run\b|does not hold|\bholds\b|"
                           r"forced by the apparatus", re.IGNORECASE)

README_SECTION = ("README.md", "## What the studies found\n", "\n## ")
SUMMARIES = [README_SECTION, ("docs/index.md", "## The studies\n", None),
             ("docs/studies/paper.md", "## What we found\n", "\n## "),
             ("docs/studies/removability.md", "## What the map says\n", "\n## "),
             ("docs/studies/history.md", "## What we found\n", "\n## "),
             ("docs/studies/circuits.md", "## What we found\n", "\n## "),
             ("docs/studies/development.md", "## What we found\n", "\n## ")]
"""(file, section start, section end): the prose that states outcomes."""


def section(path: str, start: str, end: str | None) -> str:
    text = (REPO / path).read_text()
    assert start in text, f"{path}: no section {start.strip()!r}"
    body = text.split(start, 1)[1]
    return body.split(end, 1)[0] if end else body


def quotes(text: str) -> list[tuple[str, str]]:
    """``(word, "study/id")`` for every quoted outcome (one per claim named)."""
    return [(m["word"], i.strip("`")) for m in QUOTE.finditer(text) for i in re.findall(r"`[^`]+`", m["ids"])]


def verdict_of(ref: str) -> str:
    study, _, cid = ref.partition("/")
    if study not in SOURCES:
        raise AssertionError(f"{ref}: unknown study {study!r}; expected one of {sorted(SOURCES)}")
    path, col = SOURCES[study]
    df = pd.read_csv(REPO / path, dtype=str, keep_default_na=False)
    rows = df[df["id"] == cid]
    assert len(rows) == 1, f"{ref}: {len(rows)} rows with id {cid!r} in {path}"
    return rows.iloc[0][col]


@pytest.mark.parametrize("path,start,end", SUMMARIES, ids=[s[0] for s in SUMMARIES])
def test_every_stated_outcome_is_its_verdict_row(path, start, end):
    text = section(path, start, end)
    for word, ref in quotes(text):
        assert word == verdict_of(ref), f"{path}: says {word!r} for {ref}, the verdict table says {verdict_of(ref)!r}"
    rest = QUOTE.sub("", text)
    stray = [m.group(0) for m in VERDICT_WORDS.finditer(rest)]
    assert not stray, f"{path}: verdict words outside a quoted claim: {stray}"


def test_summaries_quote_the_verdicts():
    """The README and the front page quote at least the central claims of the graded studies."""
    readme = {ref for _, ref in quotes(section(*README_SECTION))}
    assert {"paper/fade_keeps", "paper/forced_zero_fails", "removability/grid", "history/gap_sign"} <= readme
    front = {ref for _, ref in quotes(section("docs/index.md", "## The studies\n", None))}
    assert {"paper/fade_keeps", "removability/grid", "history/gap_sign"} <= front


def test_a_wrong_word_is_caught():
    """The checker itself: a planted sentence that misquotes a verdict fails, one that quotes it passes."""
    wrong = "the fade *reproduced* (claim `paper/fade_keeps`)"
    (word, ref), = quotes(wrong)
    assert word != verdict_of(ref)
    right = f"the fade *{verdict_of('paper/fade_keeps')}* (claim `paper/fade_keeps`)"
    assert [w == verdict_of(r) for w, r in quotes(right)] == [True]
    assert VERDICT_WORDS.search(QUOTE.sub("", "the contrast does not reproduce here"))


@pytest.mark.parametrize("path", ["README.md", "docs/index.md", "docs/studies/index.md"])
def test_no_claim_is_said_to_be_declared_before_its_runs_wholesale(path):
    text = (REPO / path).read_text().lower()
    for wrong in ("every claim is declared before", "every claim was declared before",
                  "each declaring its claims with a rule fixed in code before its runs",
                  "every claim a study tests is declared before its runs"):
        assert wrong not in text, f"{path}: {wrong!r}"


@pytest.mark.parametrize("study", sorted(SOURCES))
def test_every_verdict_row_states_its_provenance_and_seeds(study):
    path, col = SOURCES[study]
    df = pd.read_csv(REPO / path, dtype=str, keep_default_na=False)
    assert {"id", *PROVENANCE_COLUMNS} <= set(df.columns), path
    for prov, word in zip(df["provenance"], df[col]):
        Provenance.parse(prov)  # a word of the fixed vocabulary
        Outcome.parse(word)
    seeds = df["seeds run (large)" if study == "paper-large" else "seeds run"]
    for cell, word in zip(seeds, df[col]):
        if cell != "—":
            k, n = (int(x) for x in cell.split(" of "))
            if k < n:
                assert word.startswith("not run"), f"{path}: graded {word!r} on {cell} declared seeds"


def test_paper_one_seed_arms_are_not_run():
    df = pd.read_csv(REPO / "results/paper/verdicts.csv", dtype=str, keep_default_na=False).set_index("id")
    for cid in ("fade_window", "shapes", "markov", "linreg"):
        assert df.loc[cid, "verdict"] == "not run (1 of 3 seeds)" and df.loc[cid, "seeds run"] == "1 of 3", cid
    assert df.loc["fade_keeps", "seeds run"] == "3 of 3" and df.loc["fade_keeps", "verdict"] == "partly"


# ------------------------------------------------------------------------------ claims: provenance
def test_checked_seeds_grades_a_short_claim_not_run():
    c = Claim("x", rule="r")
    v = Verdict(c, "0.7", Outcome.PARTLY, provenance=Provenance.DECLARED_AFTER, seeds_run=1, seeds_declared=3)
    short = v.checked_seeds()
    assert short.word == "not run (1 of 3 seeds)" and short.outcome is Outcome.NOT_RUN and short.ours == "0.7"
    assert short.provenance is Provenance.DECLARED_AFTER
    full = Verdict(c, "0.7", Outcome.PARTLY, seeds_run=3, seeds_declared=3)
    assert full.checked_seeds() is full and not full.short_of_seeds


def test_verdict_table_adds_provenance_columns_only_when_stated():
    c = Claim("x", rule="r")
    plain = verdict_table([Verdict(c, "1", Outcome.REPRODUCED)])
    assert list(plain.columns) == ["claim", "ours", "study", "rule", "verdict"]
    stated = verdict_table([Verdict(c, "1", Outcome.REPRODUCED, provenance=Provenance.RESTATED, seeds_run=2,
                                    seeds_declared=3), Verdict(c, "2", Outcome.INCONCLUSIVE)])
    assert list(stated.columns)[-2:] == list(PROVENANCE_COLUMNS)
    assert stated["seeds run"].tolist() == ["2 of 3", "—"]
    assert stated["provenance"].tolist() == ["restated after the results", "—"]


def test_provenance_words_and_seed_cells_are_checked():
    assert Provenance.parse("declared before the runs") is Provenance.DECLARED_BEFORE
    with pytest.raises(ValueError, match="not a provenance word"):
        Provenance.parse("declared before")
    assert seeds_cell(1, 3) == "1 of 3" and seeds_cell(None, 3) == "—"
    with pytest.raises(ValueError, match="seeds_cell: run"):
        seeds_cell(-1, 3)
