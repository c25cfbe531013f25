"""A pytest node id's parts, for every reader that names a test: the file, the classes around the
test, and the test's name with its parametrization.

pytest writes `dir/test_f.py::TestC::test_x[ids]`, and the ids in brackets are the user's own
text: `pytest.mark.parametrize(..., ids=["a/b::c[d]"])` puts `::` and `[` inside them. So a node id
is split on `::` only before its parametrization, never inside it (cutting at the last `::` named
the test above `c[d]]`).
"""

from __future__ import annotations


def split_node_id(node_id: str) -> tuple[str, list[str], str]:
    """(file, classes, test): `d/t.py::C::test_x[a::b]` -> (`d/t.py`, [`C`], `test_x[a::b]`); an id
    with no `::` (a file, or the summary's `*`) is its own file, with no test."""
    file, sep, rest = node_id.partition("::")
    if not sep:
        return node_id, [], ""
    head, bracket, params = rest.partition("[")
    *classes, name = head.split("::")
    return file, classes, name + bracket + params


def short_name(node_id: str) -> str:
    """The test's name with its parametrization, `test_x[a::b]` (the whole id where it has none)."""
    return split_node_id(node_id)[2] or node_id
