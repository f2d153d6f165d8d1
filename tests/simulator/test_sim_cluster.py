"""Placement by free GPUs: best fit on one server, whole servers for larger jobs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sibylla.simulator.cluster import Cluster


def test_a_small_job_goes_where_it_fits_tightest():
    cluster = Cluster(servers=3, gpus_per_server=8)
    cluster.place(6)  # server 0 keeps 2 free
    cluster.place(4)  # server 1 keeps 4 free
    assert cluster.place(2) == ((0, 2),)
    assert cluster.place(3) == ((1, 3),)
    assert cluster.free == [0, 1, 8]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 20)), max_size=40))
def test_fits_and_free_counts_stay_true_through_any_placements_and_releases(ops):
    cluster = Cluster(servers=3, gpus_per_server=8)
    held = []
    for release, gpus in ops:
        if release and held:
            cluster.release(held.pop(gpus % len(held)))
        else:
            room = (
                max(cluster.free) >= gpus if gpus <= 8 else cluster.free.count(8) >= -(-gpus // 8)
            )
            assert cluster.fits(gpus) == room
            if room:
                allocation = cluster.place(gpus)
                assert sum(t for _, t in allocation) == gpus
                held.append(allocation)
        assert all(0 <= f <= 8 for f in cluster.free)
        assert cluster.free_gpus == sum(cluster.free) == 24 - sum(t for a in held for _, t in a)
