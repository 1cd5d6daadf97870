"""cxltier: the Python client of cxltierd, the daemon that tiers KV-cache blocks.

A binding (pybind11) of the C++ client library libcxltier; docs/python.md
shows the whole API. In short::

    import cxltier, numpy as np
    model = cxltier.Model(layers=2, query_heads=4, kv_heads=2, head_dim=32, dtype_bytes=4)
    with cxltier.Client("/tmp/c.sock", model, max_blocks=256, name="engine") as c:
        pool = c.create_memfd_pool(256)            # pool.array: numpy over the pool, no copy
        keys = [cxltier.Key.from_sequence(7, i) for i in range(4)]
        r = c.admit(pool, keys, blocks=[0, 1, 2, 3])
        c.observe(r.slots, np.float32([1.0, 0.5, 0.2, 0.1]))   # shared memory, no syscall
        c.tiers_of(r.slots)                        # where the daemon placed them
        c.hint(7, "idle", keys)                    # scheduler hints
        c.release(keys)

Copy mode (pinned pools, device-DAX)::

    c.create_tier_pools(256)
    r = c.admit(c.tier_pool(0), keys)              # the client holds each new block's write lease
    with c.write(r.slots[0]) as view: view[:] = kv_bytes
    with c.acquire(r.slots[0]) as view: use(view)  # read lease: the bytes stay put

Every failure raises a ``cxltier.Error`` subclass with the daemon's code and message.
"""

from __future__ import annotations

from . import _cxltier
from ._cxltier import (
    AdmitResult,
    HintKind,
    HintResult,
    Key,
    Model,
    Pool,
    ReadLease,
    ReleaseResult,
    ReportResult,
    WriteLease,
    aggregate_streams,
    daemon_stats,
    default_socket_path,
    error_name,
    kv_head_of_query_head,
    query_heads_to_streams,
)
from . import errors as _errors
from .errors import *  # noqa: F401,F403
from .errors import Error, _make_error
from .gqa import aggregate_streams_np, block_masses, query_heads_to_streams_np

_cxltier._set_error_factory(_make_error)

#: Tier numbers as the daemon publishes them: 0 is DRAM, 1 the next tier, and
#: a host with more than two has 2, 3, ... below it (up to 7). "Not in DRAM"
#: is ``tier not in (TIER_FAST, TIER_NONE)``, not ``tier == TIER_SLOW``.
TIER_FAST = 0
TIER_SLOW = 1
TIER_NONE = 255


class Client(_cxltier._Client):
    """A connection to cxltierd: hello, a state segment mapped, pools, blocks.

    ``Client(socket_path=None, model=None, max_blocks=1024, name="python")``
    connects at once (``socket_path`` None: ``default_socket_path()``;
    ``model`` None: the llama3-70b preset) and raises a ``cxltier.Error`` when
    the daemon refuses (``GeometryError`` for a block size other than the
    daemon's) or cannot be reached (``InternalError``).

    Usable as a context manager: ``close()`` at the end. Views of pool or
    lease memory keep what they view mapped after ``close()``; the
    connection ends once the client and every such view are gone.

    One thread at a time per call is enough: every method locks the client
    and releases the GIL while it talks to the daemon.
    """

    def __init__(
        self,
        socket_path: str | None = None,
        model: Model | None = None,
        max_blocks: int = 1024,
        name: str = "python",
    ) -> None:
        super().__init__(
            socket_path if socket_path is not None else default_socket_path(),
            model if model is not None else Model.preset("llama3-70b"),
            max_blocks,
            name,
        )

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "cxltier.Client(closed)"
        return f"cxltier.Client({self.socket_path!r}, client_id={self.client_id}, slots={self.slots})"


__all__ = [
    "Client",
    "Key",
    "Model",
    "Pool",
    "HintKind",
    "AdmitResult",
    "ReleaseResult",
    "HintResult",
    "ReportResult",
    "ReadLease",
    "WriteLease",
    "default_socket_path",
    "daemon_stats",
    "error_name",
    "aggregate_streams",
    "query_heads_to_streams",
    "kv_head_of_query_head",
    "aggregate_streams_np",
    "query_heads_to_streams_np",
    "block_masses",
    "TIER_FAST",
    "TIER_SLOW",
    "TIER_NONE",
] + _errors.__all__
