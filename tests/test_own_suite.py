"""A project's own suite through `racecheck run` as a user writes it: a one-rank session that looks
like torchrun's, the failures' messages after the table, the world checked against the GPUs."""

from __future__ import annotations

from tests.test_runner import _fast_sessions, racecheck, records, summary_counts, write_suite  # noqa: F401

# The common conftest idiom: join the world when a launcher started one, with torch's defaults.
TORCHRUN_CONFTEST = """
import os
import pytest
import torch.distributed as dist

@pytest.fixture(scope="session", autouse=True)
def world():
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        yield
        dist.destroy_process_group()
    else:
        yield
"""
ALL_REDUCE = """
import torch
import torch.distributed as dist

def test_all_reduce():
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [float(dist.get_world_size())] * 3
"""


def test_a_one_rank_session_is_a_world_that_init_process_group_joins_with_its_defaults(tmp_path):
    root = write_suite(
        tmp_path / "p", arms={"a": {}}, tests={"conftest.py": TORCHRUN_CONFTEST, "test_world.py": ALL_REDUCE}
    )
    res = racecheck("run", "--trials", 2, "--out", tmp_path / "out", "-q", cwd=root)
    assert res.code == 0, res
    assert [r.outcome for r in records(tmp_path / "out")] == ["passed", "passed"], records(tmp_path / "out")[0]
    assert summary_counts(tmp_path / "out")[("a", "*")] == (0, 2)
