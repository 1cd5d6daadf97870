"""GQA aggregation in numpy: per-(layer, KV head) attention into one mass per block.

The same arithmetic as the C++ ``cxltier::QueryHeadsToStreams`` and
``cxltier::AggregateStreams`` (exposed as ``cxltier.query_heads_to_streams``
and ``cxltier.aggregate_streams``), written in numpy so an engine can run it
on its own arrays, batched. The sums are sequential float32 sums in the C++
order (``np.cumsum``), so both give the same bits, not only close values.

Shapes (L layers, H query heads, K KV heads, G = H / K the GQA group):

- ``per_query_head``: ``(..., L * H)`` layer-major, query head ``h`` of layer
  ``l`` at ``l * H + h``; query heads ``k * G .. k * G + G - 1`` read KV head ``k``.
- ``per_stream``: ``(..., L * K)``, stream ``l * K + k``.
"""

from __future__ import annotations

import numpy as np


def _reduce(a: np.ndarray, how: str) -> np.ndarray:
    """Reduces the last axis in order: sequential float32, as the C++ loop."""
    if how == "max":
        return a.max(axis=-1)
    s = np.cumsum(a, axis=-1, dtype=np.float32)[..., -1]
    if how == "sum":
        return s
    if how == "mean":
        return (s / np.float32(a.shape[-1])).astype(np.float32)
    raise ValueError(f"how is 'sum', 'mean' or 'max', not {how!r}")


def query_heads_to_streams_np(model, per_query_head, how: str = "sum") -> np.ndarray:
    """Folds per-query-head values onto their KV heads' streams: ``(..., L*H) -> (..., L*K)``."""
    a = np.asarray(per_query_head, dtype=np.float32)
    L, H, K = model.layers, model.query_heads, model.kv_heads
    if K == 0 or H % K or a.ndim == 0 or a.shape[-1] != L * H or L * H == 0:
        raise ValueError(f"the last axis must hold layers x query_heads = {L * H} values")
    g = a.reshape(a.shape[:-1] + (L, K, H // K))
    return _reduce(g, how).reshape(a.shape[:-1] + (L * K,))


def aggregate_streams_np(model, per_stream, how: str = "sum"):
    """Reduces ``(..., L*K)`` stream values to one mass each; non-finite values are skipped.

    A row with no finite value gives 0, as in C++. One row in, a float out.
    """
    a = np.asarray(per_stream, dtype=np.float32)
    n = model.layers * model.kv_heads
    if a.ndim == 0 or a.shape[-1] != n:
        raise ValueError(f"the last axis has {a.shape[-1] if a.ndim else 0} values, not the {n} streams")
    finite = np.isfinite(a)
    count = finite.sum(axis=-1)
    if how == "max":
        out = np.where(finite, a, np.float32(-np.inf)).max(axis=-1)
    else:
        out = _reduce(np.where(finite, a, np.float32(0)), "sum")
        if how == "mean":
            out = (out / np.maximum(count, 1).astype(np.float32)).astype(np.float32)
        elif how != "sum":
            raise ValueError(f"how is 'sum', 'mean' or 'max', not {how!r}")
    out = np.where(count > 0, out, np.float32(0)).astype(np.float32)
    return float(out) if a.ndim == 1 else out


def block_masses(model, attention, how: str = "sum") -> np.ndarray:
    """One attention mass per block from one step's attention weights.

    ``attention``: ``(L, H, T)``, the softmax weights of the newest token's
    queries over the ``T`` tokens in the cache, per layer and query head. Each
    block of ``model.block_tokens`` tokens gets, per (layer, query head), the
    sum of its tokens' weights; query heads are summed onto their KV heads'
    streams (``query_heads_to_streams_np``), and the streams are reduced with
    ``how`` (``aggregate_streams_np``). Returns ``(ceil(T / block_tokens),)``
    float32; a partial last block counts its tokens.
    """
    a = np.asarray(attention, dtype=np.float32)
    L, H = model.layers, model.query_heads
    if a.ndim != 3 or a.shape[0] != L or a.shape[1] != H:
        raise ValueError(f"attention must be (layers={L}, query_heads={H}, tokens)")
    bt = model.block_tokens
    T = a.shape[2]
    nb = -(-T // bt)
    padded = np.zeros((L, H, nb * bt), dtype=np.float32)
    padded[:, :, :T] = a
    per_block = padded.reshape(L, H, nb, bt).sum(axis=-1, dtype=np.float32)  # (L, H, nb)
    per_qh = np.moveaxis(per_block, 2, 0).reshape(nb, L * H)
    streams = query_heads_to_streams_np(model, per_qh, "sum")
    return np.atleast_1d(aggregate_streams_np(model, streams, how)).astype(np.float32)


__all__ = ["query_heads_to_streams_np", "aggregate_streams_np", "block_masses"]
