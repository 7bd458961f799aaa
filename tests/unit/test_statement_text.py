"""The statements as sent: named, comments cut, quoted text kept, short enough for psycopg's cache."""

from __future__ import annotations

import re

import pytest
from psycopg import _queries

from jobtui.kernel.db import _blocks, parse_blocks, query_names, statements, with_fragments, without_comments


def test_comments_are_cut_and_quoted_text_is_kept() -> None:
    text = "\n".join(
        [
            "-- a line of its own",
            "SELECT a,  -- after code",
            "       'it''s -- kept' AS b,",
            "    -- indented, its own line",
            "       E'\\' -- kept too' AS c,",
            '       "col--name",',
            "       $body$ -- kept in a body $body$, $$ -- and here $$",
            "FROM t -- the end",
        ]
    )
    assert without_comments(text) == "\n".join(
        [
            "SELECT a,",
            "       'it''s -- kept' AS b,",
            "       E'\\' -- kept too' AS c,",
            '       "col--name",',
            "       $body$ -- kept in a body $body$, $$ -- and here $$",
            "FROM t",
        ]
    )


def test_a_word_ending_in_e_does_not_open_an_escaped_string() -> None:
    # In time'a\' the backslash escapes nothing: the literal ends at its second quote.
    assert without_comments("SELECT time'a\\' -- cut\nFROM t") == "SELECT time'a\\'\nFROM t"
    assert without_comments("SELECT e'a\\' -- kept'") == "SELECT e'a\\' -- kept'"


def test_an_unclosed_quote_keeps_the_rest() -> None:
    assert without_comments("SELECT 'a -- b") == "SELECT 'a -- b"


def named_fragments(text: str, fragments: dict[str, str]) -> list[str]:
    """The fragments `text` names, and those they name in turn."""
    named = [fragment for fragment in fragments if f"{{{fragment}}}" in text]
    return named + [inner for fragment in named for inner in named_fragments(fragments[fragment], fragments)]


def test_every_statement_keeps_its_placeholders() -> None:
    placeholder = re.compile(r"%\((\w+)\)s")
    texts, fragments = _blocks()
    for name, text in texts.items():
        sent = statements()[name].as_string(None)
        written = text + "".join(fragments[fragment] for fragment in named_fragments(text, fragments))
        assert set(placeholder.findall(sent)) == set(placeholder.findall(written)), name
        head, body = sent.split("\n", 1)
        assert head == f"-- jobtui: {name}", name
        assert "--" not in re.sub(r"'(?:[^']|'')*'", "", body), name


def test_every_statement_fits_psycopgs_parse_cache() -> None:
    """Longer statements are parsed again on each execution: 40 us per claim, measured."""
    for name in query_names():
        sent = statements()[name].as_string(None).encode()
        assert len(sent) <= _queries.MAX_CACHED_STATEMENT_LENGTH, (name, len(sent))


def test_each_fragment_is_written_into_the_statements_that_name_it() -> None:
    texts, fragments = _blocks()
    for fragment, body in fragments.items():
        naming = [name for name, text in texts.items() if fragment in named_fragments(text, fragments)]
        assert naming, f"no statement names the fragment {fragment}"
        for name in naming:
            sent = statements()[name].as_string(None)
            # A fragment's {schema} and {channel} are filled in as the statement's are, and
            # the fragments it names are written out in it (checked here where they stand alone).
            written = without_comments(body).replace("{schema}", '"jobtui"').replace("{channel}", '"jobtui.job"')
            for part in re.split(r"\{\w+\}", written):
                assert part in sent, (name, part)
            assert f"{{{fragment}}}" not in sent, name


def test_a_fragment_may_name_another() -> None:
    fragments = {"a_outer": "x IN (SELECT {a_inner}) -- why", "a_inner": "1 -- one\n"}
    assert with_fragments("SELECT {a_outer} FROM {schema}.t", fragments) == "SELECT x IN (SELECT 1) FROM {schema}.t"


def test_doubled_braces_stay_literal_beside_a_fragment_of_their_name() -> None:
    """`{{f}}` is a literal `{f}` for psycopg's format(), not the fragment f."""
    assert with_fragments("SELECT '{{f}}', {f}", {"f": "1"}) == "SELECT '{{f}}', 1"


def test_a_fragment_that_names_itself_is_refused() -> None:
    with pytest.raises(ValueError, match="fragment 'a' names itself"):
        with_fragments("SELECT {a}", {"a": "{b}", "b": "{a}"})


def test_a_fragment_may_not_take_a_fields_name() -> None:
    with pytest.raises(RuntimeError, match="names a fragment 'schema'"):
        parse_blocks({"sql/x.sql": "-- fragment: schema\nx\n"})
