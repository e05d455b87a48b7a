import pytest
from hypothesis import given, strategies as st

from workbench.core.topology import Topology


def test_row_major_layout_last_axis_fastest():
    t = Topology(dp=2, pp=3)
    assert t.world_size == 6
    assert [t.coords(r) for r in range(3)] == [{"dp": 0, "pp": 0}, {"dp": 0, "pp": 1}, {"dp": 0, "pp": 2}]
    assert t.rank(dp=1, pp=2) == 5
    assert t.groups("pp") == [[0, 1, 2], [3, 4, 5]]
    assert t.groups("dp") == [[0, 3], [1, 4], [2, 5]]
    assert t.group_of(4, "dp") == [1, 4]
    assert t.peer(1, "pp", 1) == 2 and t.peer(2, "pp", 1) is None and t.peer(2, "pp", 1, wrap=True) == 0


@given(st.lists(st.integers(1, 4), min_size=1, max_size=4))
def test_rank_coords_bijection(sizes):
    t = Topology(tuple((f"a{i}", s) for i, s in enumerate(sizes)))
    for r in range(t.world_size):
        assert t.rank(**t.coords(r)) == r
    for axis in t.names:
        groups = t.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(t.world_size))
        assert all(len(g) == t.size(axis) for g in groups)


def test_tensor_grid_groups():
    t = Topology(dp=2, tp_row=2, tp_col=2)
    assert t.group_of(0, "tp_col") == [0, 1]
    assert t.group_of(0, "tp_row") == [0, 2]
    assert t.group_of(5, "dp") == [1, 5]
    assert t.size("pp") == 1


def test_parse_and_json():
    t = Topology.parse("dp=2, pp=4")
    assert t == Topology(dp=2, pp=4)
    assert Topology.parse("dp=2 x pp=4") == t
    assert Topology.from_dict(t.to_dict()) == t
    assert str(t) == "dp=2 x pp=4"
    assert "rank" in t.describe()


@pytest.mark.parametrize(
    "make, fragment",
    [(lambda: Topology(), "at least one axis"), (lambda: Topology(dp=0), "size must be an int >= 1"),
     (lambda: Topology(dp=-2), "size must be"), (lambda: Topology({"DP": 2}), "lowercase identifier"),
     (lambda: Topology((("dp", 2), ("dp", 2))), "given twice"), (lambda: Topology(dp=2).coords(2), r"rank must be an int in \[0, 1\]"),
     (lambda: Topology(dp=2).rank(dp=2), "out of range"), (lambda: Topology(dp=2).rank(pp=0), "missing"),
     (lambda: Topology(dp=2).groups("pp"), "unknown axis"), (lambda: Topology.parse("dp2"), "malformed axis")],
)
def test_bad_input(make, fragment):
    with pytest.raises(ValueError, match=fragment):
        make()
