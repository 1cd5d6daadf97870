"""The module without a daemon: import, keys, models, errors, GQA aggregation."""

import numpy as np
import pytest

import cxltier
from conftest import MODEL


def test_the_package_is_the_build_or_installed_one():
    assert cxltier.Client is not None
    assert cxltier.default_socket_path().endswith(".sock")
    assert cxltier.error_name(5) == "bad-payload"


def test_keys():
    k = cxltier.Key.from_sequence(7, 3)
    assert (k.hi, k.lo) == (7, 3)
    assert int(k) == (7 << 64) | 3
    assert cxltier.Key(int(k)) == k
    assert k == (7, 3)
    assert cxltier.Key.parse(str(k)) == k
    assert len({k, cxltier.Key(7, 3), cxltier.Key(7, 4)}) == 2
    a = cxltier.Key.from_parent(None, np.arange(16, dtype=np.uint32))
    b = cxltier.Key.from_parent(None, list(range(16)))
    assert a == b and not a == cxltier.Key.from_parent(a, list(range(16)))
    with pytest.raises(ValueError):
        cxltier.Key.parse("not hex")
    with pytest.raises(ValueError):
        cxltier.Key(1 << 128)


def test_models():
    m = cxltier.Model.preset("llama3-70b")
    assert (m.layers, m.query_heads, m.kv_heads, m.streams) == (80, 64, 8, 640)
    assert m.block_bytes == 5 * 1024 * 1024
    assert "mistral-7b" in cxltier.Model.presets()
    with pytest.raises(ValueError):
        cxltier.Model.preset("gpt-17")
    with pytest.raises(cxltier.GeometryError) as e:
        cxltier.Model(layers=0, query_heads=1, kv_heads=1, head_dim=1).validate()
    assert e.value.code == 12 and e.value.name == "geometry"
    assert cxltier.kv_head_of_query_head(m, 9) == 1


def test_no_daemon_is_an_internal_error_with_the_path():
    with pytest.raises(cxltier.InternalError) as e:
        cxltier.Client("/nonexistent/cxltierd.sock", MODEL)
    assert "connect to /nonexistent/cxltierd.sock" in str(e.value)
    assert isinstance(e.value, cxltier.Error) and e.value.code == 11


@pytest.mark.parametrize("how", ["sum", "mean", "max"])
def test_gqa_aggregation_numpy_agrees_with_cpp(how):
    rng = np.random.default_rng(17)
    for model in (MODEL, cxltier.Model.preset("llama3-70b"), cxltier.Model.preset("qwen2.5-7b")):
        per_qh = rng.random((5, model.layers * model.query_heads), dtype=np.float32)
        cpp = cxltier.query_heads_to_streams(model, per_qh, how)
        npy = cxltier.query_heads_to_streams_np(model, per_qh, how)
        assert cpp.shape == npy.shape == (5, model.streams)
        assert np.array_equal(cpp, npy), how  # the same bits, not only close
        streams = rng.random((7, model.streams), dtype=np.float32) * 3
        streams[0, 3] = np.nan
        streams[1, :] = np.inf  # no finite value: 0
        streams[2, 2] = -np.inf
        cpp = cxltier.aggregate_streams(model, streams, how)
        npy = cxltier.aggregate_streams_np(model, streams, how)
        assert np.array_equal(cpp, npy), how
        assert cpp[1] == 0
        assert cxltier.aggregate_streams(model, streams[4], how) == cxltier.aggregate_streams_np(model, streams[4], how)


def test_gqa_aggregation_refuses_wrong_shapes():
    with pytest.raises(ValueError):
        cxltier.aggregate_streams(MODEL, np.zeros(5, np.float32))
    with pytest.raises(ValueError):
        cxltier.aggregate_streams_np(MODEL, np.zeros(5, np.float32))
    with pytest.raises(ValueError):
        cxltier.query_heads_to_streams(MODEL, np.zeros(3, np.float32))
    with pytest.raises(ValueError):
        cxltier.aggregate_streams(MODEL, np.zeros(MODEL.streams), how="median")


def test_block_masses_sum_the_attention_of_each_block():
    rng = np.random.default_rng(3)
    T = 40  # two whole blocks and a partial one
    logits = rng.standard_normal((MODEL.layers, MODEL.query_heads, T)).astype(np.float32)
    w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    m = cxltier.block_masses(MODEL, w)
    assert m.shape == (3,)
    # Every (layer, query head) row sums to 1, so the blocks' masses sum to L x H.
    assert m.sum() == pytest.approx(MODEL.layers * MODEL.query_heads, rel=1e-5)
    expect = w[:, :, 16:32].sum()
    assert m[1] == pytest.approx(expect, rel=1e-5)
    # The same through the C++ aggregation, stream by stream.
    per_qh = np.stack([w[:, :, b * 16:(b + 1) * 16].sum(-1).reshape(-1) for b in range(3)]).astype(np.float32)
    cpp = cxltier.aggregate_streams(MODEL, cxltier.query_heads_to_streams(MODEL, per_qh))
    assert np.allclose(cpp, m, rtol=1e-5)
