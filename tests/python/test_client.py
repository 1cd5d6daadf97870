"""The client against a real cxltierd: page-mode pools, blocks, tiers, stats, errors, reconnect."""

import os
import signal
import subprocess

import numpy as np
import pytest

import cxltier
from conftest import BLOCK, MODEL, pool_bytes_tool, wait_for


def keys_of(seq, n, first=0):
    return [cxltier.Key.from_sequence(seq, i) for i in range(first, first + n)]


def test_connect_and_properties(client):
    assert client.client_id > 0
    assert client.slots >= 64
    assert client.block_bytes == BLOCK
    assert client.tick_ms == 20
    assert client.wait_ticks(2)
    assert "cxltier.Client" in repr(client)
    st = client.stats("status")
    assert isinstance(st, dict)
    assert isinstance(client.stats("tiers"), list)
    assert cxltier.daemon_stats(client.socket_path, "status").keys() == st.keys()


def test_memfd_pool_is_a_numpy_view_without_copies(client):
    pool = client.create_memfd_pool(16)
    assert (pool.kind, pool.blocks, pool.stride, pool.block_bytes) == ("memfd", 16, BLOCK, BLOCK)
    a = pool.array
    assert a.shape == (16, BLOCK) and a.dtype == np.uint8 and a.flags.writeable
    a[3, :8] = np.arange(8, dtype=np.uint8)
    b = pool.block(3)
    assert list(b[:8]) == list(range(8))
    b[9] = 99  # a view of the same memory
    assert pool.array[3, 9] == 99
    with os.fdopen(os.dup(pool.fd), "rb") as f:  # the memfd holds the same bytes
        f.seek(3 * BLOCK)
        assert f.read(10) == bytes(range(8)) + b"\0" + bytes([99])
    with pytest.raises(IndexError):
        pool.block(16)
    # A view keeps the mapping alive after the pool object and the client go.
    del pool
    client.close()
    assert a[3, 9] == 99
    with pytest.raises(cxltier.NotReadyError):
        client.slots


def test_admit_observe_tiers_release(client):
    pool = client.create_memfd_pool(16)
    keys = keys_of(11, 16)
    r = client.admit(pool, keys, blocks=np.arange(16))
    assert len(r) == 16 and r.slots.dtype == np.uint32
    assert not r.restored.any()
    assert list(client.slots_of(keys)) == list(r.slots)
    assert client.slot_of(keys[5]) == r.slots[5]
    assert client.slot_of(cxltier.Key(999, 999)) is None
    # Observe vectorised: blocks 0-7 hot, the others touched once.
    assert client.observe(r.slots, np.float32(1.0)) == 16
    for _ in range(5):
        assert client.observe(r.slots[:8], np.full(8, 2.0, np.float32)) == 8
        assert client.wait_ticks(1)
    # Tier 0 holds 8 blocks: the daemon places them, and the slot says where.
    wait_for(lambda: (client.tiers_of(r.slots) == cxltier.TIER_FAST).sum() == 8,
             what="8 blocks in tier 0")
    tiers = client.tiers_of(r.slots)
    assert set(np.unique(tiers)) <= {0, 1}
    assert client.tier_of(int(r.slots[0])) == tiers[0]
    wait_for(lambda: np.array_equal(client.query_tiers(keys), client.tiers_of(r.slots)),
             what="query_tiers to agree with the segment")
    s = client.slot_state(int(r.slots[0]))
    assert s["key"] == keys[0] and s["touch_count"] >= 1
    # Bad masses are refused without a syscall; good ones counted.
    assert client.observe(r.slots[:3], np.float32([1.0, np.nan, -1.0])) == 1
    assert client.observe([client.slots + 5], 1.0) == 0
    rep = client.report(r.slots[:2], np.float32([1.0, -3.0]))
    assert (rep.accepted, rep.rejected) == (1, 1)
    rel = client.release(keys[:4] + [cxltier.Key(5, 5)])
    assert (rel.released, rel.unknown) == (4, 1)
    assert client.slot_of(keys[0]) is None
    # Re-admitting a released key brings its ghost's state back.
    r2 = client.admit(pool, keys[:1], blocks=[0])
    assert r2.restored[0]


def test_a_failed_report_says_what_it_took(daemon, client):
    """report() sends in parts: its error carries what the parts before it took (none here)."""
    pool = client.create_range_pool(4)
    r = client.admit(pool, [cxltier.Key(31, i) for i in range(4)], blocks=[0, 1, 2, 3])
    assert daemon.stop() == 0, daemon.log()
    with pytest.raises(cxltier.Error) as e:
        client.report(r.slots, np.float32(1.0))
    assert (e.value.accepted, e.value.rejected) == (0, 0)
    assert "after 0 observations were taken" in e.value.message


def test_keys_as_arrays_ints_and_tuples(client):
    pool = client.create_range_pool(8)
    assert pool.kind == "range"
    arr = np.array([[21, i] for i in range(4)], dtype=np.uint64)
    r = client.admit(pool, arr, blocks=[0, 1, 2, 3])
    assert list(client.slots_of([(21, 0), (21 << 64) | 1, cxltier.Key(21, 2), (21, 3)])) == list(r.slots)
    assert client.release(arr).released == 4


def test_bad_input_raises_errors_with_the_daemons_message(daemon, client):
    pool = client.create_memfd_pool(4)
    # A block index past the pool: the daemon's bad-slot, its message kept.
    with pytest.raises(cxltier.BadSlotError) as e:
        client.admit(pool, keys_of(1, 1), blocks=[4])
    assert e.value.code == 9 and e.value.name == "bad-slot"
    assert str(e.value).startswith("bad-slot: ")
    # A pool id the daemon never gave.
    with pytest.raises(cxltier.BadPoolError) as e:
        client.admit(77, keys_of(1, 1), blocks=[0])
    assert e.value.message.startswith("bad-pool: ")
    # A stride that is not a page multiple.
    with pytest.raises(cxltier.BadPoolError) as e:
        client.create_memfd_pool(4, stride=BLOCK + 100)
    assert "stride" in str(e.value)
    # Hints: a kind the protocol has not, and group 0.
    with pytest.raises(cxltier.BadPayloadError) as e:
        client.hint(3, 9)
    assert e.value.code == 5
    with pytest.raises(cxltier.BadPayloadError):
        client.hint(0, "idle")
    with pytest.raises(ValueError):
        client.hint(1, "later")
    # A geometry other than the daemon's block size.
    other = cxltier.Model(layers=1, query_heads=1, kv_heads=1, head_dim=128)
    with pytest.raises(cxltier.GeometryError) as e:
        cxltier.Client(daemon.socket, other)
    assert "geometry: " in str(e.value) and "block" in str(e.value)
    # Stats of something that is not there.
    with pytest.raises(cxltier.Error) as e:
        client.stats("everything")
    assert e.value.code == 5 and "everything" in e.value.message
    # Another client of this user holding the same key: denied.
    client.admit(pool, keys_of(2, 1), blocks=[0])
    with cxltier.Client(daemon.socket, MODEL, max_blocks=8, name="second") as other_client:
        p2 = other_client.create_memfd_pool(1)
        with pytest.raises(cxltier.DeniedError):
            other_client.admit(p2, keys_of(2, 1), blocks=[0])
    # The client's own checks are Python's errors.
    with pytest.raises(ValueError):
        client.admit(pool, keys_of(3, 2), blocks=[0, 1, 2])
    with pytest.raises(TypeError):
        client.admit(pool, [object()], blocks=[0])
    with pytest.raises(ValueError):
        client.admit(pool, keys_of(3, 1))  # page mode needs block indexes
    # None of it broke the connection.
    assert client.admit(pool, keys_of(4, 1), blocks=[1]).slots.size == 1


def test_a_daemon_restart_is_survived_through_reconnect(daemon, client):
    pool = client.create_memfd_pool(8)
    pool.array[:, :] = (np.arange(8 * BLOCK) % 251).astype(np.uint8).reshape(8, BLOCK)
    keys = keys_of(31, 8)
    r = client.admit(pool, keys, blocks=np.arange(8))
    client.observe(r.slots, 3.0)
    assert client.wait_ticks(3)
    daemon.restart()
    with pytest.raises(cxltier.Error):
        client.admit(pool, keys_of(32, 1), blocks=[0])  # the old connection is gone
    restored = client.reconnect()
    assert restored == 8  # the checkpoint kept every block's state
    slots = client.slots_of(keys)
    assert (slots != 0xFFFFFFFF).all()
    assert client.observe(slots, 1.0) == 8
    wait_for(lambda: (client.tiers_of(slots) != cxltier.TIER_NONE).all(), what="tiers after reconnect")
    assert client.release(keys).released == 8
    # The pool's bytes never changed: the same mapping throughout.
    assert np.array_equal(pool.array.reshape(-1), (np.arange(8 * BLOCK) % 251).astype(np.uint8))


def test_hints_move_an_idle_group_out_and_a_soon_group_in(client):
    pool = client.create_memfd_pool(16)
    a, b = keys_of(501, 8), keys_of(502, 8)
    rb = client.admit(pool, b, blocks=np.arange(8, 16))
    client.observe(rb.slots, 1.0)
    wait_for(lambda: (client.tiers_of(rb.slots) == 0).sum() == 8, what="B's blocks in tier 0")
    hb = client.hint(2, cxltier.HintKind.IDLE, b)
    assert (hb.grouped, hb.unknown, hb.applied) == (8, 0, True)
    ra = client.admit(pool, a, blocks=np.arange(8))
    client.observe(ra.slots, 1.0)
    # A's touches take the room B's idle blocks left: A in, B out.
    wait_for(lambda: (client.tiers_of(ra.slots) == 0).all() and (client.tiers_of(rb.slots) == 1).all(),
             what="A's blocks in tier 0 and B's in tier 1")
    # A goes idle, B comes soon: B is back without a touch.
    assert client.hint(1, "idle", a).applied
    hs = client.hint(2, "soon")
    assert hs.applied and hs.grouped == 0
    wait_for(lambda: (client.tiers_of(rb.slots) == 0).all() and (client.tiers_of(ra.slots) == 1).all(),
             what="B back in tier 0 and A out")
    assert client.hint(1, "done", [cxltier.Key(1, 1)]).unknown == 1
    hints = client.stats("status")["hints"]
    assert hints["requests"] >= 4 and hints["prefetched"] >= 8


def test_numpy_views_see_the_bytes_the_loadgen_code_sees(client):
    """Python writes with numpy, loadgen's BlockIntact checks; loadgen's FillBlock writes, numpy checks."""
    pool = client.create_memfd_pool(8)
    keys = keys_of(77, 8)
    r = client.admit(pool, keys, blocks=np.arange(8))

    def mix(hi, lo, words):
        m = np.uint64
        with np.errstate(over="ignore"):
            x = (m(hi) * m(0x9E3779B97F4A7C15)) ^ (m(lo) + m(0x632BE59BD9B4E019)) ^ (words * m(0xC2B2AE3D27D4EB4F))
            return x ^ (x >> m(29))

    words = np.arange(BLOCK // 8, dtype=np.uint64)
    for i in range(4):  # blocks 0-3 from Python
        w = pool.block(i).view(np.uint64)
        w[:] = mix(keys[i].hi, keys[i].lo, words)
        w[0], w[1] = keys[i].hi, keys[i].lo
    args = [f"{i}:{keys[i].hi}:{keys[i].lo}" for i in range(8)]
    run = lambda mode, which: subprocess.run(  # noqa: E731
        [pool_bytes_tool(), mode, str(pool.fd), str(pool.stride), str(BLOCK)] + which,
        pass_fds=[pool.fd], capture_output=True, text=True, timeout=120)
    # While the daemon moves the pages between tiers, as it likes.
    client.observe(r.slots, 1.0)
    out = run("check", args[:4])
    assert out.returncode == 0, out.stdout + out.stderr
    out = run("fill", args[4:])
    assert out.returncode == 0, out.stdout + out.stderr
    for i in range(4, 8):
        w = pool.block(i).view(np.uint64)
        assert w[0] == keys[i].hi and w[1] == keys[i].lo
        assert np.array_equal(w[2:], mix(keys[i].hi, keys[i].lo, words)[2:])
    # A byte changed from Python is one loadgen sees.
    pool.block(2)[100] ^= 0xFF
    out = run("check", args[:4])
    assert out.returncode == 1 and "block 2" in out.stdout


def test_closing_twice_and_using_a_closed_client(daemon):
    c = cxltier.Client(daemon.socket, MODEL, max_blocks=8)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(cxltier.NotReadyError):
        c.stats()
