#!/usr/bin/env python3
"""A small decoder-only attention engine whose KV cache lives in a cxltier pool.

numpy only, random weights, no downloads. Several sequences decode with real
softmax attention; their KV cache is kept in 16-token blocks in a pool that
cxltierd tiers while they decode (page mode: a memfd pool whose pages the
daemon moves; copy mode: a pool per tier, blocks copied, read under leases).
Each step every block's attention mass, from the real attention weights
(``cxltier.block_masses``: per (layer, query head) the weights of the block's
tokens, summed over each GQA group and over the streams), is reported to the
daemon (``Client.observe``). Sequences take turns in two batches, and the
engine's scheduler says so (``Client.hint``: idle, soon).

The same decode runs a second time with every block in plain DRAM (a dict of
numpy arrays behind the same connector interface), and the logits of both
runs must be bit-identical: where the daemon puts a block never changes what
the model computes. The fast-tier hit rate (block loads that found the block
in tier 0) and the daemon's moves are printed at the end.

    cxltierd --config scripts/demo.toml --socket /tmp/c.sock --state-dir /tmp/c-state &
    PYTHONPATH=build/python python3 examples/kv_engine.py --socket /tmp/c.sock

The daemon must place 16 KiB blocks (this model's; its first client sets the
size unless [engine] block_bytes says otherwise). Exit status 0 when the
logits match, 1 when they do not, 2 when the daemon cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import cxltier

# ---- the model: 2 layers, 4 query heads on 2 KV heads (GQA), head dim 32, float32 ----

LAYERS, QUERY_HEADS, KV_HEADS, HEAD_DIM = 2, 4, 2, 32
D_MODEL = QUERY_HEADS * HEAD_DIM
VOCAB = 256
BLOCK_TOKENS = 16
MODEL = cxltier.Model(layers=LAYERS, query_heads=QUERY_HEADS, kv_heads=KV_HEADS,
                      head_dim=HEAD_DIM, dtype_bytes=4, block_tokens=BLOCK_TOKENS,
                      name="kv-engine")
# One block: K and V of 16 tokens for every layer and KV head (16 KiB).
BLOCK_SHAPE = (LAYERS, 2, KV_HEADS, BLOCK_TOKENS, HEAD_DIM)


class Weights:
    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        f = np.float32
        s = 1.0 / np.sqrt(D_MODEL)
        self.embed = rng.standard_normal((VOCAB, D_MODEL)).astype(f)
        self.layers = []
        for _ in range(LAYERS):
            self.layers.append({
                "wq": (rng.standard_normal((D_MODEL, QUERY_HEADS * HEAD_DIM)) * s).astype(f),
                "wk": (rng.standard_normal((D_MODEL, KV_HEADS * HEAD_DIM)) * s).astype(f),
                "wv": (rng.standard_normal((D_MODEL, KV_HEADS * HEAD_DIM)) * s).astype(f),
                "wo": (rng.standard_normal((QUERY_HEADS * HEAD_DIM, D_MODEL)) * s).astype(f),
                "w1": (rng.standard_normal((D_MODEL, 4 * D_MODEL)) * s).astype(f),
                "w2": (rng.standard_normal((4 * D_MODEL, D_MODEL)) * s / 2).astype(f),
            })
        self.unembed = (rng.standard_normal((D_MODEL, VOCAB)) * s).astype(f)


def rms_norm(x: np.ndarray) -> np.ndarray:
    return (x / np.sqrt(np.mean(x * x) + np.float32(1e-6))).astype(np.float32)


def rope(x: np.ndarray, pos: int) -> np.ndarray:
    """Rotary position embedding over the last axis (head dim)."""
    half = HEAD_DIM // 2
    freq = (1.0 / (10000.0 ** (np.arange(half, dtype=np.float32) / half))).astype(np.float32)
    ang = np.float32(pos) * freq
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], axis=-1).astype(np.float32)


# ---- where blocks live: the connector (store, load, lookup by block hash) ----

class DramConnector:
    """Every block in plain DRAM: the reference run."""

    def __init__(self) -> None:
        self.blocks: dict[int, np.ndarray] = {}
        self.loads = self.hits = 0

    def lookup(self, hashes: list[cxltier.Key]) -> int:
        n = 0
        for h in hashes:
            if int(h) not in self.blocks:
                break
            n += 1
        return n

    def store(self, h: cxltier.Key, kv: np.ndarray) -> None:
        self.blocks[int(h)] = kv.copy()

    def load(self, h: cxltier.Key) -> np.ndarray:
        self.loads += 1
        self.hits += 1
        return self.blocks[int(h)]

    def touch(self, hashes, masses) -> None:
        pass

    def hint(self, group: int, kind: str, hashes=None) -> None:
        pass


class CxltierConnector:
    """An offload connector over cxltier: blocks by hash in a pool the daemon tiers.

    ``store`` writes a full block into a free pool block and admits its hash;
    ``load`` returns its K and V (page mode: a view of the pool, no copy; copy
    mode: read under a read lease); ``lookup`` counts how many leading hashes
    are held (a prefix hit); ``touch`` reports attention masses; ``hint``
    passes the scheduler's word on.
    """

    def __init__(self, client: cxltier.Client, mode: str, capacity: int) -> None:
        self.client = client
        self.mode = mode
        if mode == "page":
            self.pool = client.create_memfd_pool(capacity)
            self.free = list(range(capacity - 1, -1, -1))
        else:
            client.create_tier_pools(capacity)
            self.pool = client.tier_pool(0)  # admit here; the daemon places each block
        self.where: dict[int, tuple[int, int]] = {}  # hash -> (slot, pool block)
        self.loads = self.hits = 0

    def lookup(self, hashes: list[cxltier.Key]) -> int:
        n = 0
        for h in hashes:
            if int(h) not in self.where:
                break
            n += 1
        return n

    def store(self, h: cxltier.Key, kv: np.ndarray) -> None:
        if int(h) in self.where:
            return
        raw = np.ascontiguousarray(kv, dtype=np.float32).view(np.uint8).reshape(-1)
        if self.mode == "page":
            block = self.free.pop()
            self.pool.block(block)[:] = raw  # the bytes first, then the daemon hears of them
            slot = int(self.client.admit(self.pool, [h], blocks=[block]).slots[0])
        else:
            block = 0
            slot = int(self.client.admit(self.pool, [h]).slots[0])
            with self.client.write(slot) as view:  # the admission's write lease
                view[:] = raw
        self.where[int(h)] = (slot, block)

    def load(self, h: cxltier.Key) -> np.ndarray:
        slot, block = self.where[int(h)]
        self.loads += 1
        if self.mode == "page":
            self.hits += self.client.tier_of(slot) == cxltier.TIER_FAST
            return self.pool.block(block).view(np.float32).reshape(BLOCK_SHAPE)
        lease = self.client.acquire(slot)
        with lease as view:  # the bytes stay put while we copy them out (a DMA, on a GPU)
            kv = view.view(np.float32).reshape(BLOCK_SHAPE).copy()
        self.hits += lease.tier == cxltier.TIER_FAST
        return kv

    def touch(self, hashes, masses) -> None:
        slots = [self.where[int(h)][0] for h in hashes]
        self.client.observe(np.asarray(slots, np.uint32), np.asarray(masses, np.float32))

    def hint(self, group: int, kind: str, hashes=None) -> None:
        self.client.hint(group, kind, hashes)


# ---- the engine ----

class Sequence:
    def __init__(self, sid: int, prompt: np.ndarray) -> None:
        self.sid = sid
        self.tokens: list[int] = [int(t) for t in prompt]
        self.prompt_len = len(prompt)
        self.hashes: list[cxltier.Key] = []  # of its full blocks, a prefix-hash chain
        self.partial = np.zeros(BLOCK_SHAPE, np.float32)  # the block being filled
        self.pos = 0  # tokens whose K and V exist
        self.logits: list[np.ndarray] = []
        self.masses: list[np.ndarray] = []  # the last step's mass per full block

    def block_hash(self, b: int) -> cxltier.Key:
        parent = self.hashes[b - 1] if b else None
        return cxltier.Key.from_parent(parent, np.asarray(self.tokens[b * 16:(b + 1) * 16], np.uint32))


class Engine:
    def __init__(self, weights: Weights, connector) -> None:
        self.w = weights
        self.kv = connector
        self.prefix_blocks_reused = 0

    def prefill_from_cache(self, seq: Sequence) -> None:
        """Reuses the leading prompt blocks some earlier sequence stored (a prefix hit)."""
        full = seq.prompt_len // BLOCK_TOKENS
        hashes = []
        for b in range(full):
            parent = hashes[-1] if hashes else None
            hashes.append(cxltier.Key.from_parent(parent, np.asarray(seq.tokens[b * 16:(b + 1) * 16], np.uint32)))
        n = self.kv.lookup(hashes)
        seq.hashes = hashes[:n]
        seq.pos = n * BLOCK_TOKENS
        self.prefix_blocks_reused += n

    def step(self, seq: Sequence) -> None:
        """One token through the stack: its K and V join the cache, attention reads every block."""
        t = seq.pos
        x = self.w.embed[seq.tokens[t]].copy()
        n_full = len(seq.hashes)
        blocks = [self.kv.load(h) for h in seq.hashes]  # (L, 2, K, 16, hd) each
        att_all = np.zeros((LAYERS, QUERY_HEADS, t + 1), np.float32)
        for li, lw in enumerate(self.w.layers):
            h = rms_norm(x)
            q = rope((h @ lw["wq"]).reshape(QUERY_HEADS, HEAD_DIM), t)
            k = rope((h @ lw["wk"]).reshape(KV_HEADS, HEAD_DIM), t)
            v = (h @ lw["wv"]).reshape(KV_HEADS, HEAD_DIM)
            seq.partial[li, 0, :, t % BLOCK_TOKENS] = k
            seq.partial[li, 1, :, t % BLOCK_TOKENS] = v
            ks = [b[li, 0] for b in blocks] + [seq.partial[li, 0, :, : t % BLOCK_TOKENS + 1]]
            vs = [b[li, 1] for b in blocks] + [seq.partial[li, 1, :, : t % BLOCK_TOKENS + 1]]
            K = np.concatenate(ks, axis=1)  # (KV heads, t + 1, hd)
            V = np.concatenate(vs, axis=1)
            out = np.empty((QUERY_HEADS, HEAD_DIM), np.float32)
            for qh in range(QUERY_HEADS):
                kh = cxltier.kv_head_of_query_head(MODEL, qh)
                s = (K[kh] @ q[qh]) / np.float32(np.sqrt(HEAD_DIM))
                p = np.exp(s - s.max()).astype(np.float32)
                p /= p.sum()
                att_all[li, qh] = p
                out[qh] = p @ V[kh]
            x = x + out.reshape(-1) @ lw["wo"]
            h = rms_norm(x)
            x = x + np.maximum(h @ lw["w1"], 0) @ lw["w2"]
        logits = rms_norm(x) @ self.w.unembed
        seq.pos += 1
        # The block's attention mass, from the real weights: one per full block.
        masses = cxltier.block_masses(MODEL, att_all)[:n_full]
        if n_full:
            self.kv.touch(seq.hashes, masses)
        seq.masses.append(masses)
        if seq.pos % BLOCK_TOKENS == 0:  # the block is full: it goes to the pool
            b = seq.pos // BLOCK_TOKENS - 1
            h_ = seq.block_hash(b)
            self.kv.store(h_, seq.partial)
            seq.hashes.append(h_)
            seq.partial = np.zeros(BLOCK_SHAPE, np.float32)
        if seq.pos >= seq.prompt_len:
            seq.logits.append(logits)
            if seq.pos == len(seq.tokens):
                seq.tokens.append(int(np.argmax(logits)))  # greedy


def run(connector, args, label: str, client=None):
    weights = Weights(args.seed)
    rng = np.random.default_rng(args.seed + 1)
    shared = rng.integers(0, VOCAB, args.shared_prefix)  # a system prompt every sequence has
    seqs = [Sequence(i + 1, np.concatenate([shared, rng.integers(0, VOCAB, args.prompt)]))
            for i in range(args.sequences)]
    eng = Engine(weights, connector)
    batches = [seqs[i::2] for i in range(2)]  # two batches take turns
    for turn in range(args.turns):
        active, waiting = batches[turn % 2], batches[(turn + 1) % 2]
        for s in waiting:  # the scheduler: these wait for their users
            if s.hashes:
                connector.hint(s.sid, "idle", s.hashes)
        for s in active:
            if s.hashes:
                connector.hint(s.sid, "soon", s.hashes)
        for _ in range(args.steps_per_turn):
            for s in active:
                if s.pos == 0:  # a new sequence: its prompt's leading blocks may be cached
                    eng.prefill_from_cache(s)
                while s.pos < s.prompt_len:  # prefill, token by token
                    eng.step(s)
                eng.step(s)
        if client is not None:
            client.wait_ticks(2)  # let the daemon act on what it saw
    return seqs, eng


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=cxltier.default_socket_path())
    ap.add_argument("--mode", choices=["page", "copy"], default="page",
                    help="page: one memfd pool, pages moved; copy: a pool per tier, blocks copied")
    ap.add_argument("--sequences", type=int, default=6)
    ap.add_argument("--shared-prefix", type=int, default=32, help="tokens every prompt starts with")
    ap.add_argument("--prompt", type=int, default=24, help="tokens of each prompt after the prefix")
    ap.add_argument("--turns", type=int, default=6, help="the batches take this many turns")
    ap.add_argument("--steps-per-turn", type=int, default=16, help="tokens decoded per turn")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--capacity", type=int, default=128, help="pool blocks")
    ap.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = ap.parse_args()

    t0 = time.monotonic()
    ref_seqs, ref_eng = run(DramConnector(), args, "dram")
    t_ref = time.monotonic() - t0
    try:
        client = cxltier.Client(args.socket, MODEL, max_blocks=args.capacity, name="kv-engine")
    except cxltier.Error as e:
        print(f"kv_engine: cannot use cxltierd at {args.socket}: {e}", file=sys.stderr)
        return 2
    with client:
        before = client.stats("status")["migrations"]
        conn = CxltierConnector(client, args.mode, args.capacity)
        t0 = time.monotonic()
        seqs, eng = run(conn, args, "cxltier", client)
        t_cx = time.monotonic() - t0
        client.wait_ticks(2)
        after = client.stats("status")["migrations"]
        tiers = client.tiers_of([conn.where[int(h)][0] for s in seqs for h in s.hashes])
        identical = all(len(a.logits) == len(b.logits) and
                        all(x.tobytes() == y.tobytes() for x, y in zip(a.logits, b.logits))
                        for a, b in zip(seqs, ref_seqs))
        moved = {k: after[k] - before[k] for k in ("promotions", "demotions", "promoted_bytes", "demoted_bytes")}
        moved["copies"] = after["copy"]["copies"] - before["copy"]["copies"]
        hit_rate = conn.hits / conn.loads if conn.loads else 0.0
        summary = {
            "mode": args.mode,
            "sequences": len(seqs),
            "tokens_decoded": sum(len(s.logits) for s in seqs),
            "blocks_stored": len(conn.where),
            "prefix_blocks_reused": eng.prefix_blocks_reused,
            "block_loads": conn.loads,
            "fast_tier_hits": conn.hits,
            "fast_tier_hit_rate": round(hit_rate, 4),
            "blocks_in_tier0_at_end": int((tiers == 0).sum()),
            "moves": moved,
            "logits_bit_identical": identical,
            "seconds": {"dram": round(t_ref, 2), "cxltier": round(t_cx, 2)},
        }
        s0 = seqs[0]
        print(f"sequence {s0.sid}: attention mass per block at its last step "
              f"(sum over {LAYERS} layers x {QUERY_HEADS} query heads = {LAYERS * QUERY_HEADS}):")
        print("  " + " ".join(f"{m:.3f}" for m in s0.masses[-1]))
        print(f"decoded {summary['tokens_decoded']} tokens of {len(seqs)} sequences "
              f"({args.mode} mode), {len(conn.where)} blocks of {MODEL.block_bytes // 1024} KiB in the pool, "
              f"{eng.prefix_blocks_reused} prompt blocks reused by prefix hash")
        print(f"fast-tier hit rate: {hit_rate:.1%} ({conn.hits} of {conn.loads} block loads found in tier 0)")
        print(f"moves: {moved['promotions']} promotions, {moved['demotions']} demotions "
              f"({(moved['promoted_bytes'] + moved['demoted_bytes']) // 1024} KiB), {moved['copies']} copies")
        print("logits: " + ("bit-identical to the all-DRAM run" if identical else "DIFFER from the all-DRAM run"))
        if args.json:
            print(json.dumps(summary))
        return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
