import pytest
from hypothesis import given, strategies as st

from workbench.core.partition import Partition


def test_text_form():
    p = Partition.parse("0-3|4-9|10-15")
    assert p.num_stages == 3 and p.num_layers == 16
    assert p.sizes == [4, 6, 6] and p.cuts == [4, 10]
    assert str(p) == "0-3|4-9|10-15"
    assert Partition.parse("0-3|4|5-7").sizes == [4, 1, 3]
    assert p.stage_of(9) == 1 and list(p.layers(0)) == [0, 1, 2, 3]
    assert Partition.from_dict(p.to_dict()) == p


def test_constructors_agree():
    assert Partition.from_sizes([4, 6, 6]) == Partition.from_cuts([4, 10], 16) == Partition.parse("0-3|4-9|10-15")
    assert Partition.uniform(10, 3).sizes == [4, 3, 3]
    assert Partition.uniform(3, 3).sizes == [1, 1, 1]


@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_round_trip_property(sizes):
    p = Partition.from_sizes(sizes)
    assert Partition.parse(str(p), num_layers=sum(sizes)) == p
    assert p.stage_sums([1.0] * p.num_layers) == [float(s) for s in sizes]


@pytest.mark.parametrize(
    "make, fragment",
    [(lambda: Partition(()), "at least one stage"),
     (lambda: Partition.parse("0-3|5-9"), "leaves layers 4-4 uncovered"),
     (lambda: Partition.parse("0-3|3-9"), "overlaps"),
     (lambda: Partition.parse("0-3|9-4"), "empty or reversed"),
     (lambda: Partition.parse("1-3"), "should start at 0"),
     (lambda: Partition.parse("0-3|x"), "malformed stage 1"),
     (lambda: Partition.parse(""), "partition text must be like"),
     (lambda: Partition.parse("0-3|4-9", num_layers=12), "model has 12 layers"),
     (lambda: Partition.uniform(3, 4), "at most 3 stages"),
     (lambda: Partition.from_sizes([3, 0]), "stage 1 size must be"),
     (lambda: Partition.from_cuts([4, 4], 8), "strictly increasing")],
)
def test_bad_input(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()
