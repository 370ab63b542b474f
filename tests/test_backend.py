"""The ggml backend wrapper: graphs computed again reuse their allocation."""
import numpy as np
import pytest

from ggserve.native import ggml


@pytest.fixture
def backend():
    b = ggml.Backend(n_threads=1, use_gpu=False)
    yield b
    b.close()


def _doubling_graph(backend):
    g = backend.graph()
    x = g.input("x", ggml.F32, (4,))
    return g, x, g.output(g.scale(x, 2.0))


def test_a_graph_computed_again_takes_the_new_inputs(backend):
    g, x, y = _doubling_graph(backend)
    backend.compute(g, {x: np.arange(4, dtype=np.float32)})
    assert backend.holds(g)
    backend.compute(g, {x: np.array([5, 6, 7, 8], dtype=np.float32)})
    assert y.read().tolist() == [10.0, 12.0, 14.0, 16.0]
    g.close()


def test_a_graph_is_not_run_again_after_another_graph_ran(backend):
    g1, x1, _ = _doubling_graph(backend)
    g2, x2, _ = _doubling_graph(backend)
    backend.compute(g1, {x1: np.zeros(4, dtype=np.float32)})
    backend.compute(g2, {x2: np.zeros(4, dtype=np.float32)})
    assert not backend.holds(g1)
    with pytest.raises(ggml.GGMLError, match="build it again"):
        backend.compute(g1, {x1: np.zeros(4, dtype=np.float32)})
    g1.close()
    g2.close()


def test_ops_lists_what_the_graph_runs(backend):
    g, _, _ = _doubling_graph(backend)
    assert [(op, shape) for op, _, shape in g.ops()] == [("SCALE", (4, 1, 1, 1))]
    g.close()
