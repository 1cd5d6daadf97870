"""Copy mode from Python: tier pools as numpy, write and read leases as context managers."""

import numpy as np
import pytest

import cxltier
from conftest import BLOCK, wait_for


def pattern(key, n=BLOCK):
    rng = np.random.default_rng([key.hi, key.lo])
    return rng.integers(0, 256, n, dtype=np.uint8)


def test_tier_pools_and_leases(client):
    assert client.tier_pool(0) is None
    client.create_tier_pools(24)
    t0, t1 = client.tier_pool(0), client.tier_pool(1)
    assert (t0.kind, t1.kind) == ("tier0", "tier1")
    assert t0.blocks == 8 and t1.blocks == 24  # tier 0: what the 8-block budget allows
    assert t0.array.shape == (8, t0.stride)
    keys = [cxltier.Key.from_sequence(900, i) for i in range(16)]
    r = client.admit(t0, keys)  # the daemon places them: tier 0 while it has room
    assert (r.tiers == 0).sum() == 8 and (r.tiers == 1).sum() == 8
    # Admission gives the client each new block's write lease: fill, then end it.
    for k, s in zip(keys, r.slots):
        with client.write(int(s)) as view:
            assert view.flags.writeable and view.shape == (BLOCK,)
            view[:] = pattern(k)
    # A read lease by slot or by key.
    with client.acquire(keys[3]) as view:
        assert not view.flags.writeable
        assert np.array_equal(view, pattern(keys[3]))
    lease = client.acquire(int(r.slots[12]))
    assert lease.held and lease.tier in (0, 1)
    where = client.location_of(int(r.slots[12]))
    assert where is not None and where[0] == lease.tier
    pool = t0 if lease.tier == 0 else t1
    assert np.array_equal(pool.array[where[1], :BLOCK], lease.data)  # the lease views the pool
    lease.release()
    assert not lease.held
    with pytest.raises(cxltier.NoLeaseError):
        lease.data
    # Touch only the slow half: the daemon copies it into tier 0 and the rest out.
    slow = r.slots[r.tiers == 1]
    for _ in range(200):
        client.observe(slow, 4.0)
        if (client.tiers_of(slow) == 0).all():
            break
        client.wait_ticks(1)
    wait_for(lambda: (client.tiers_of(slow) == 0).all(), what="the touched blocks copied into tier 0")
    migrations = client.stats("status")["migrations"]
    assert migrations["copy"]["copies"] >= 8 and migrations["promotions"] >= 8
    # Every block still holds its bytes, wherever it is now.
    for k in keys:
        with client.acquire(k) as view:
            assert np.array_equal(view, pattern(k)), k


def test_lease_errors(client):
    client.create_tier_pools(4)
    r = client.admit(client.tier_pool(0), [cxltier.Key(1, 1)])
    s = int(r.slots[0])
    w = client.write(s)  # takes over the admission's lease
    with pytest.raises(cxltier.BusyError) as e:
        client.write(s)  # held: a second writer is refused
    assert e.value.code == 14 and "write lease" in e.value.message
    w.release()
    w2 = client.write(s)  # begins a new one
    assert w2.held
    w2.release()
    with pytest.raises(cxltier.NoLeaseError):
        client.end_write(s)
    with pytest.raises(cxltier.NoLeaseError):
        client.acquire(int(client.slots) - 1)  # a slot with no block
    with pytest.raises(cxltier.NoLeaseError):
        client.acquire(cxltier.Key(2, 2))  # a key not held
    # More leases than one reader row holds: another row serves them.
    leases = [client.acquire(s) for _ in range(40)]
    assert all(l.held for l in leases)
    for l in leases:
        l.release()


def test_an_integer_is_a_slot_and_a_key_is_never_an_int(client):
    """numpy's integers are slots too; an int never names a key (a small one was a slot)."""
    client.create_tier_pools(8)
    keys = [cxltier.Key(5, i) for i in range(4)]
    r = client.admit(client.tier_pool(0), keys)
    for k, s in zip(keys, r.slots):  # r.slots[i] is a numpy.uint32
        with client.write(s) as view:
            view[:] = pattern(k)
    for k, s in zip(keys, r.slots):
        for which in (s, np.int64(s), int(s), k, (k.hi, k.lo)):
            with client.acquire(which) as view:
                assert np.array_equal(view, pattern(k)), (k, which)
    with pytest.raises(ValueError, match="Key"):
        client.acquire(int(keys[0]))  # a key as an int: refused, not read as a slot
    with pytest.raises(ValueError):
        client.write(2**32)
    with pytest.raises(ValueError):
        client.acquire(-1)


def test_held_leases_survive_a_daemon_restart(daemon, client):
    """Leases held across SIGTERM and reconnect() keep their bytes; the blocks stay whole."""
    client.create_tier_pools(16)
    keys = [cxltier.Key(7, i) for i in range(12)]
    r = client.admit(client.tier_pool(0), keys)
    for k, s in zip(keys, r.slots):
        with client.write(int(s)) as view:  # the admission's write lease
            view[:] = pattern(k)
    held = [client.acquire(k) for k in keys[:8]]
    before = [np.array(l.data, copy=True) for l in held]
    assert daemon.stop() == 0, daemon.log()
    for l, b in zip(held, before):
        assert np.array_equal(l.data, b)  # not a byte changed by the stop
    daemon.start()
    client.reconnect()
    assert client.tiers >= 2
    for l, k in zip(held, keys):
        assert np.array_equal(l.data, pattern(k))
    client.wait_ticks(5)
    for l, k in zip(held, keys):
        assert np.array_equal(l.data, pattern(k))
        l.release()
    for k in keys:  # every block whole at its slot under the new daemon
        with client.acquire(k) as view:
            assert np.array_equal(view, pattern(k)), k


def test_a_view_keeps_its_lease(client):
    """`v = client.acquire(k).data`: the view keeps the lease, so the place is not reused."""
    import gc
    client.create_tier_pools(4)
    t0 = client.tier_pool(0)
    a = cxltier.Key(31, 0)
    r = client.admit(t0, [a])
    with client.write(int(r.slots[0])) as view:
        view[:] = 0xAA
    v = client.acquire(a).data  # the lease object itself is not kept
    gc.collect()
    client.release([a])
    client.wait_ticks(5)  # time for the daemon to free A's place, were it not leased
    fresh = [cxltier.Key(32, i) for i in range(4)]
    r = client.admit(t0, fresh)
    for s in r.slots:
        with client.write(int(s)) as view:
            view[:] = 0xBB
    assert (v == 0xAA).all(), "the view shows another block: its lease was released under it"


def test_a_write_lease_follows_its_block_across_a_reconnect(daemon, client):
    """WriteLease.release() after reconnect() ends its own block's lease, not its old slot's."""
    client.create_tier_pools(8)
    keys = [cxltier.Key(33, i) for i in range(6)]
    r = client.admit(client.tier_pool(0), keys)
    held = [client.write(int(s)) for s in r.slots]  # the admissions' write leases
    daemon.restart()
    client.reconnect()
    held[0].release()
    w = client.write(keys[0])  # its block's lease ended: a new one begins
    w.release()
    for k in keys[1:]:
        with pytest.raises(cxltier.BusyError):
            client.write(k)  # each still held by its own WriteLease
    for l in held[1:]:
        l.release()


def test_admitting_a_held_key_leaves_its_write_lease_alone(client):
    """A held key admitted again is not a new admission: no second write lease."""
    client.create_tier_pools(4)
    t0 = client.tier_pool(0)
    k = cxltier.Key(34, 0)
    client.admit(t0, [k])
    w = client.write(k)
    client.admit(t0, [k])
    with pytest.raises(cxltier.BusyError):
        client.write(k)
    w.release()
