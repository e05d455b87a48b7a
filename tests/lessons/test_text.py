"""The lessons' generic text helpers: lists in words, fixed-width tables."""

from __future__ import annotations

import pytest

from workbench.lessons.text import listing, text_table


def test_listing_joins_items_as_a_sentence_does():
    assert listing([]) == ""
    assert listing(["a"]) == "a"
    assert listing(["a", "b"]) == "a and b"
    assert listing(["a", "b", "c", "d"]) == "a, b, c and d"


def test_text_table_aligns_the_header_with_the_columns():
    table = text_table(["kind", "ms", "ratio"], [("1f1b", 12.345, 1.0), ("zbh1", 9.5, 1.29953)],
                       ["<6", ">8.2f", ">7.3f"])
    assert table.splitlines() == ["kind        ms  ratio",
                                  "1f1b     12.35  1.000",
                                  "zbh1      9.50  1.300"]


def test_text_table_refuses_rows_and_headers_that_do_not_fit_the_formats():
    with pytest.raises(ValueError, match="2 column titles for 3 formats"):
        text_table(["a", "b"], [], ["<3", "<3", "<3"])
    with pytest.raises(ValueError, match="a row of 1 values for 2 columns"):
        text_table(["a", "b"], [(1,)], ["<3", "<3"])
