"""Which GPUs are free on which server, and where a job goes.

Placement follows the free GPUs: a job that fits on one server goes to the server with the
fewest free GPUs that still hold it (best fit, which keeps whole servers free for large jobs); a
job larger than a server takes whole free servers, as gang-scheduled data-parallel jobs do.
Servers are kept in buckets by free count so that both questions cost O(GPUs per server).
"""

from __future__ import annotations

__all__ = ["Allocation", "Cluster"]

# (server, GPUs taken on it) for each server an attempt runs on.
Allocation = tuple[tuple[int, int], ...]


class Cluster:
    """``servers`` identical servers with ``gpus_per_server`` GPUs each."""

    def __init__(self, servers: int, gpus_per_server: int) -> None:
        if servers < 1 or gpus_per_server < 1:
            raise ValueError("need at least one server with at least one GPU")
        self.servers = servers
        self.gpus_per_server = gpus_per_server
        self.free = [gpus_per_server] * servers
        self._buckets: list[set[int]] = [set() for _ in range(gpus_per_server + 1)]
        self._buckets[gpus_per_server] = set(range(servers))
        self.free_gpus = servers * gpus_per_server
        # (most free GPUs on one server, wholly free servers): a scheduling pass asks "does it
        # fit?" for many queued jobs between two placements, so it is cached until one changes.
        self._headroom: tuple[int, int] | None = None

    @property
    def total_gpus(self) -> int:
        return self.servers * self.gpus_per_server

    def fits(self, gpus: int) -> bool:
        """Whether a job of ``gpus`` GPUs can be placed now."""
        g = self.gpus_per_server
        if self._headroom is None:
            largest = next((f for f in range(g, 0, -1) if self._buckets[f]), 0)
            self._headroom = (largest, len(self._buckets[g]))
        if gpus <= g:
            return gpus <= self._headroom[0]
        return -(-gpus // g) <= self._headroom[1]

    def place(self, gpus: int) -> Allocation:
        """Take ``gpus`` GPUs; the caller checked :meth:`fits`."""
        g = self.gpus_per_server
        if gpus <= g:
            for f in range(gpus, g + 1):
                if self._buckets[f]:
                    server = min(self._buckets[f])  # lowest id: replays are reproducible
                    self._move(server, f - gpus)
                    return ((server, gpus),)
            raise RuntimeError(f"no server has {gpus} free GPUs")
        whole = sorted(self._buckets[g])[: -(-gpus // g)]
        allocation = []
        left = gpus
        for server in whole:
            take = min(g, left)
            self._move(server, g - take)
            allocation.append((server, take))
            left -= take
        return tuple(allocation)

    def release(self, allocation: Allocation) -> None:
        for server, taken in allocation:
            self._move(server, self.free[server] + taken)

    def _move(self, server: int, new_free: int) -> None:
        if not 0 <= new_free <= self.gpus_per_server:
            raise RuntimeError(f"server {server} would have {new_free} free GPUs")
        self._headroom = None
        self._buckets[self.free[server]].discard(server)
        self._buckets[new_free].add(server)
        self.free_gpus += new_free - self.free[server]
        self.free[server] = new_free
