"""Query parsing: any text becomes a valid FTS5 expression; dates named in it become date phrases."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from nanobotd.index.ftsdb import connect
from nanobotd.index.query import parse_query
from nanobotd.index.timeintent import dates_column, find_time
from tests.index.test_builtin import HOSTILE_QUERIES


@pytest.fixture
def connection(tmp_path):
    db = connect(tmp_path / "q.db")
    db.execute("INSERT INTO units_fts (rowid, body, dates) VALUES (1, 'near the kestrel', 'd20231013 m202310')")
    yield db
    db.close()


@pytest.mark.parametrize("text", HOSTILE_QUERIES + ["yesterday", "last friday", "3 days ago", "13 October 2023"])
def test_every_query_is_valid_fts5_syntax(connection, text):
    expression = " OR ".join(parse_query(text, now=datetime(2023, 10, 14)).clauses)
    if expression:
        connection.execute("SELECT rowid FROM units_fts WHERE units_fts MATCH ?", (expression,)).fetchall()


def test_stopwords_are_dropped_and_words_are_or_ed():
    parsed = parse_query("What did Caroline research about adoption?")
    assert parsed.terms == ["caroline", "research", "adoption"]
    assert " OR ".join(parsed.clauses) == '"caroline" OR "research" OR "adoption"'


def test_a_query_of_stopwords_only_still_searches_its_words():
    assert parse_query("who are you").terms == ["who", "are", "you"]


def test_operators_and_quotes_are_plain_words(connection):
    parsed = parse_query('NEAR("the kestrel" -x*) AND OR')
    assert parsed.terms == ["near", "kestrel", "x"]
    assert connection.execute("SELECT count(*) FROM units_fts WHERE units_fts MATCH ?",
                              (" OR ".join(parsed.clauses),)).fetchone()[0] == 1


@pytest.mark.parametrize("text", ["13 October 2023", "October 13, 2023", "Oct 13th 2023", "2023-10-13",
                                  "on the 13th of October, 2023"])
def test_absolute_dates_are_recognised(text):
    assert find_time(text).days == [date(2023, 10, 13)]
    assert parse_query(text).date_keys[0] == "d20231013"


def test_relative_dates_need_the_clock():
    now = datetime(2023, 10, 14, 9, 0)  # a Saturday
    assert find_time("what did I say yesterday").days == []
    assert find_time("what did I say yesterday", now).days == [date(2023, 10, 13)]
    assert find_time("last friday", now).days == [date(2023, 10, 13)]
    assert find_time("2 days ago", now).days == [date(2023, 10, 12)]
    assert len(find_time("last week", now).days) == 7
    assert find_time("what did we do last night", now).days == [date(2023, 10, 13)]


def test_impossible_dates_are_ignored():
    assert find_time("31 February 2023 and 2023-13-01").days == []


def test_may_is_a_month_only_when_used_as_one():
    assert "may" not in parse_query("may I ask about the kestrel").terms
    assert "may" in parse_query("where did we go in May").terms
    assert parse_query("the trip in May 2023").date_keys == ["m202305"]


def test_a_named_day_matches_the_key_the_dates_column_holds(connection):
    hits = connection.execute("SELECT rowid FROM units_fts WHERE units_fts MATCH ?",
                              (" OR ".join(parse_query("on 13 October 2023").clauses),)).fetchall()
    assert hits == [(1,)]


def test_words_that_name_a_time_are_matched_as_dates_not_as_words():
    now = datetime(2023, 10, 14, 9, 0)
    parsed = parse_query("what did we discuss yesterday?", now=now)
    assert parsed.terms == [] and parsed.date_keys == ["d20231013"] and parsed.time_only
    mixed = parse_query("the kestrel budget on 13 October 2023", now=now)
    assert mixed.terms == ["kestrel", "budget"] and not mixed.time_only


def test_a_range_names_every_day_in_it_and_last_month_names_the_month():
    parsed = parse_query("Where was John between August 11 and August 15 2023?")
    assert parsed.terms == ["john"]
    assert parsed.date_keys == [f"d202308{day}" for day in (15, 11, 12, 13, 14)]
    assert parse_query("invoices last month", now=datetime(2024, 1, 10)).date_keys == ["m202312"]
    assert len(parse_query("what did we do this week", now=datetime(2023, 10, 11)).date_keys) == 3


def test_each_day_and_month_named_is_one_word_key_the_dates_column_holds():
    parsed = parse_query("the budget on 13 October 2023 and in May 2024")
    assert parsed.date_keys == ["d20231013", "m202405"]
    assert parsed.clauses == ['"budget"', 'dates : "d20231013"', 'dates : "m202405"']
    assert dates_column((date(2023, 10, 13), date(2023, 10, 14))) == "d20231013 d20231014 m202310"
    assert dates_column(()) == ""


def test_may_as_the_month_of_a_named_day_is_not_searched_as_a_word():
    assert "may" not in parse_query("what happened with the kestrel on 21 May 2026").terms
