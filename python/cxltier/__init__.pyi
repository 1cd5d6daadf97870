# Type stubs of the cxltier package (the extension _cxltier and its Python parts).
from __future__ import annotations

import enum
from typing import Any, Iterable, Literal, Sequence, SupportsIndex, Union

import numpy as np
import numpy.typing as npt

from .errors import (
    BadFrameError as BadFrameError,
    BadPayloadError as BadPayloadError,
    BadPoolError as BadPoolError,
    BadSlotError as BadSlotError,
    BadVersionError as BadVersionError,
    BusyError as BusyError,
    DeniedError as DeniedError,
    Error as Error,
    GeometryError as GeometryError,
    InternalError as InternalError,
    LimitError as LimitError,
    NoLeaseError as NoLeaseError,
    NotReadyError as NotReadyError,
    TooLargeError as TooLargeError,
    UnknownTypeError as UnknownTypeError,
)
from .gqa import (
    aggregate_streams_np as aggregate_streams_np,
    block_masses as block_masses,
    query_heads_to_streams_np as query_heads_to_streams_np,
)

TIER_FAST: int
TIER_SLOW: int
TIER_NONE: int

class Key:
    """The 16-byte identity of a block: (hi, lo)."""
    hi: int
    lo: int
    def __init__(self, hi: int = ..., lo: int = ...) -> None: ...
    @staticmethod
    def from_sequence(sequence_id: int, block_index: int) -> Key:
        """hi = sequence id, lo = block index."""
    @staticmethod
    def from_parent(parent: KeyLike | None, tokens: npt.ArrayLike) -> Key:
        """XXH3-128 of the parent key and the block's token ids (the prefix-hash key)."""
    @staticmethod
    def parse(text: str) -> Key:
        """32 hex digits, hi first (what str(key) prints)."""
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...

#: A key: a Key, an int in [0, 2**128), a (hi, lo) tuple or 16 bytes.
KeyLike = Union[Key, int, tuple[int, int], bytes]
#: Keys: one key, an iterable of keys, or a uint64 array of shape (n, 2).
Keys = Union[KeyLike, Iterable[KeyLike], npt.NDArray[np.uint64]]
Reduction = Literal["sum", "mean", "max"]

class HintKind(enum.IntEnum):
    IDLE = 1
    SOON = 2
    DONE = 3

class Model:
    """A model's KV geometry: what one block holds."""
    name: str
    def __init__(self, layers: int, query_heads: int, kv_heads: int, head_dim: int,
                 dtype_bytes: int = 2, block_tokens: int = 16, name: str = "custom") -> None: ...
    @staticmethod
    def preset(name: str) -> Model:
        """A built-in preset (Model.presets() names them)."""
    @staticmethod
    def presets() -> list[str]: ...
    @property
    def layers(self) -> int: ...
    @property
    def query_heads(self) -> int: ...
    @property
    def kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def dtype_bytes(self) -> int: ...
    @property
    def block_tokens(self) -> int: ...
    @property
    def gqa_group(self) -> int: ...
    @property
    def streams(self) -> int:
        """(layer, KV head) score streams: layers x kv_heads."""
    @property
    def block_bytes(self) -> int:
        """2 x layers x kv_heads x head_dim x dtype_bytes x block_tokens."""
    @property
    def bytes_per_token(self) -> int: ...
    def validate(self) -> None:
        """Raises GeometryError when the geometry is unusable."""

class Pool:
    """A pool of blocks. Its memory as numpy views, without copies."""
    @property
    def id(self) -> int: ...
    @property
    def kind(self) -> Literal["memfd", "range", "tier0", "tier1"]: ...
    @property
    def blocks(self) -> int: ...
    @property
    def stride(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def fd(self) -> int:
        """The memfd (a duplicate the pool owns), -1 for other kinds."""
    @property
    def array(self) -> npt.NDArray[np.uint8]:
        """uint8 (blocks, stride) over the pool's memory; keeps the mapping alive."""
    def block(self, index: int) -> npt.NDArray[np.uint8]:
        """uint8 (block_bytes,) over one block's memory."""

class AdmitResult:
    @property
    def slots(self) -> npt.NDArray[np.uint32]: ...
    @property
    def tiers(self) -> npt.NDArray[np.uint8]: ...
    @property
    def restored(self) -> npt.NDArray[np.bool_]:
        """True where a ghost's state (score, history) came back."""
    def __len__(self) -> int: ...

class ReleaseResult:
    released: int
    unknown: int

class HintResult:
    grouped: int
    unknown: int
    applied: bool

class ReportResult:
    accepted: int
    rejected: int

class ReadLease:
    """A copy-mode read lease: the block's bytes stay at .data until released."""
    @property
    def data(self) -> npt.NDArray[np.uint8]:
        """Read-only view of the block (valid while the lease is held)."""
    @property
    def slot(self) -> int: ...
    @property
    def tier(self) -> int: ...
    @property
    def held(self) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> npt.NDArray[np.uint8]: ...
    def __exit__(self, *exc: object) -> bool: ...

class WriteLease:
    """A copy-mode write lease: no copy of the block is published until released."""
    @property
    def data(self) -> npt.NDArray[np.uint8]:
        """Writable view of the block (valid while the lease is held)."""
    @property
    def slot(self) -> int: ...
    @property
    def held(self) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> npt.NDArray[np.uint8]: ...
    def __exit__(self, *exc: object) -> bool: ...

class Client:
    """A connection to cxltierd (docs/python.md)."""
    def __init__(self, socket_path: str | None = None, model: Model | None = None,
                 max_blocks: int = 1024, name: str = "python") -> None: ...
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: object) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def socket_path(self) -> str: ...
    @property
    def model(self) -> Model: ...
    @property
    def client_id(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def tick_ms(self) -> int: ...
    @property
    def daemon_ticks(self) -> int: ...

    # page mode
    def create_memfd_pool(self, blocks: int, stride: int = 0, name: str = "cxltier-pool") -> Pool:
        """A sealed memfd of blocks x stride bytes, mapped here and registered."""
    def register_memfd_pool(self, fd: int, length: int, stride: int, blocks: int) -> Pool:
        """Registers the caller's memfd (made with MFD_ALLOW_SEALING; F_SEAL_SHRINK is added)."""
    def create_range_pool(self, blocks: int, stride: int = 0) -> Pool:
        """Anonymous memory of this process, registered as an address-range pool."""

    # copy mode
    def create_tier_pools(self, blocks: int, stride: int = 0, devdax_path: str = "",
                          devdax_offset: int = 0) -> None:
        """Asks the daemon for a pool per tier and maps both."""
    def tier_pool(self, tier: int) -> Pool | None: ...
    def acquire(self, block: SupportsIndex | Key | bytes | tuple[int, int]) -> ReadLease:
        """A read lease on a slot (any integer) or a held key's slot (a key, never an int): ``with c.acquire(s) as view:``."""
    def write(self, block: SupportsIndex | Key | bytes | tuple[int, int]) -> WriteLease:
        """The write lease of a slot (adopting the one admission gives): ``with c.write(s) as view:``."""
    def end_write(self, slot: int) -> None: ...
    def location_of(self, slot: int) -> tuple[int, int, int] | None:
        """(tier, index in that tier's pool, version) as last published; None: no place."""

    # blocks
    def admit(self, pool: Pool | int, keys: Keys, blocks: npt.ArrayLike | None = None) -> AdmitResult:
        """Admits keys at pool blocks (one index each, or one for all; none for a tier pool)."""
    def release(self, keys: Keys) -> ReleaseResult: ...
    def hint(self, group: int, kind: HintKind | Literal["idle", "soon", "done"] | int,
             keys: Keys | None = None) -> HintResult:
        """A scheduler hint about a group (nonzero) of this client's blocks."""
    def observe(self, slots: npt.ArrayLike, masses: npt.ArrayLike | float) -> int:
        """Adds one observation per slot through shared memory (no syscall); returns how many were taken."""
    def report(self, slots: npt.ArrayLike, masses: npt.ArrayLike | float) -> ReportResult:
        """The same over the socket."""
    def tier_of(self, slot: int) -> int: ...
    def tiers_of(self, slots: npt.ArrayLike) -> npt.NDArray[np.uint8]: ...
    def slot_state(self, slot: int) -> dict[str, Any] | None: ...
    def slot_of(self, key: KeyLike) -> int | None: ...
    def slots_of(self, keys: Keys) -> npt.NDArray[np.uint32]:
        """Slots of held keys; 2**32 - 1 for keys not held."""
    def query_tiers(self, keys: Keys) -> npt.NDArray[np.uint8]: ...
    def stats(self, what: Literal["status", "tiers", "clients", "blocks"] = "status") -> Any: ...
    def reconnect(self) -> int:
        """After a daemon restart: hello, pools and every held key again; returns how many were restored."""
    def wait_ticks(self, n: int = 1, timeout: float = 60.0) -> bool: ...

def default_socket_path() -> str: ...
def daemon_stats(socket_path: str, what: str = "status") -> Any: ...
def error_name(code: int) -> str: ...
def aggregate_streams(model: Model, per_stream: npt.ArrayLike, how: Reduction = "sum") -> Any:
    """C++ AggregateStreams over the last axis (layers x kv_heads): a float, or an array of the leading shape."""
def query_heads_to_streams(model: Model, per_query_head: npt.ArrayLike,
                           how: Reduction = "sum") -> npt.NDArray[np.float32]:
    """C++ QueryHeadsToStreams over the last axis (layers x query_heads -> layers x kv_heads)."""
def kv_head_of_query_head(model: Model, query_head: int) -> int: ...
