"""Memory for every model family: positions with several dimensions per token in
the KV cache (M-RoPE), and a recurrent state per sequence (hybrid models)."""
import numpy as np
import pytest

from ggserve.models.memory import LayerKV, LayerRecurrent, equal_blocks
from ggserve.native import ggml
from ggserve.server.engine.memory.kv_cache import KVCache
from ggserve.server.engine.memory.model_memory import Memory
from ggserve.server.engine.memory.recurrent_state import CHECKPOINT_MIN_STEP, CTX_CHECKPOINTS, RecurrentState
from ggserve.server.engine.sequence import Request, Sequence


@pytest.fixture(scope="module")
def backend():
    b = ggml.Backend(n_threads=1, use_gpu=False)
    yield b
    b.close()


def _mrope_positions(n_text: int, grid: tuple[int, int], n_after: int) -> np.ndarray:
    """[4, n] as Qwen2-VL lays them out: text tokens p,p,p,0; an image's rows share
    its temporal position and count its grid's rows and columns."""
    rows, cols = grid
    t = list(range(n_text))
    pos = [[p, p, p, 0] for p in t]
    base = n_text
    pos += [[base, base + r, base + c, 0] for r in range(rows) for c in range(cols)]
    after = base + max(rows, cols)
    pos += [[p, p, p, 0] for p in range(after, after + n_after)]
    return np.array(pos, dtype=np.int32).T.copy()


def test_mrope_positions_round_trip_through_the_cache(backend):
    positions = _mrope_positions(5, (2, 3), 4)                 # 15 tokens
    kv = KVCache(backend, [LayerKV(8, 8, backend.cpu)], 256, n_regions=2, n_pos=4)
    cells = kv.find_cells_for([0], [15])
    kv.commit(cells, np.zeros(15, dtype=np.int64), positions)
    assert np.array_equal(kv.positions_of(cells), positions)
    assert kv.seq_copy(backend, 0, 1, int(positions[0].max()) + 1) is False   # positions are not 0..n-1
    kv.seq_cp(0, 1, 0, 6)                                     # share the cells of temporal position < 6
    shared = np.flatnonzero((kv.seqs >> np.uint64(1)) & np.uint64(1))
    assert np.array_equal(kv.positions_of(shared), positions[:, :11])    # 5 text + 6 image rows at t=5
    kv.seq_rm(0, 5)                                           # cut at temporal position 5
    kept = np.flatnonzero((kv.seqs >> np.uint64(0)) & np.uint64(1))
    assert np.array_equal(kv.positions_of(kept), positions[:, :5])


def test_a_sequence_continues_mrope_positions_after_its_prompt():
    positions = _mrope_positions(5, (2, 3), 4)
    seq = Sequence(Request("m", list(range(15)), positions=positions))
    assert np.array_equal(seq.positions(0, 15), positions)
    seq.tokens += [7, 8]                                       # two generated tokens
    # the prompt ends at 8 + 3 (after the image: 5 + max(2, 3)); generation goes on from there
    assert seq.positions(14, 3).T.tolist() == [[11, 11, 11, 0], [12, 12, 12, 0], [13, 13, 13, 0]]


def test_generation_after_a_prompt_ending_on_an_image_starts_past_its_grid():
    positions = _mrope_positions(5, (2, 3), 0)                 # 5 text tokens, then 6 image rows
    seq = Sequence(Request("m", list(range(11)), positions=positions))
    seq.tokens += [7]
    # as mtmd: n_past advances by max(rows, cols) over an image: 5 + 3
    assert seq.positions(11, 1).T.tolist() == [[8, 8, 8, 0]]


def test_text_positions_are_token_indices():
    seq = Sequence(Request("t", list(range(6))))
    assert seq.positions(2, 3).tolist() == [[2, 3, 4]]


def _row(state: RecurrentState, il: int, i: int, seq: int) -> np.ndarray:
    """seq's live state i of layer il."""
    return state.tensors[(il, i)].read().reshape(-1, state.tensors[(il, i)].ne[0])[state.live[seq]]


def _fill_row(state: RecurrentState, row: int, value: float) -> None:
    for t in state.tensors.values():
        t.write(np.full(t.ne[0], value, dtype=np.float32), int(row) * t.ne[0] * 4)


def _step(state: RecurrentState, seq: int, n: int, value: float) -> None:
    """A step of n tokens of seq that computed a state full of `value`, and succeeded."""
    _fill_row(state, state.step_values(np.array([seq]))["state_rows_out"][0], value)
    state.advance([seq], [n])


def test_recurrent_state_allocates_copies_and_frees_per_sequence(backend):
    # a fake recurrent layer between two attention layers: two state tensors per sequence
    layers = [None, LayerRecurrent((6, 10), backend.cpu), None]
    state = RecurrentState(backend, layers, n_seqs=3)
    assert state.nbytes_by_device()["CPU"] >= (6 + 10) * 4 * 3 * 2
    state.alloc(0)
    _step(state, 0, 7, 1.5)
    state.alloc(2)
    assert not _row(state, 1, 1, 2).any()
    state.copy(0, 2, 7)
    assert np.all(_row(state, 1, 0, 2) == 1.5) and np.all(_row(state, 1, 1, 2) == 1.5)
    assert state.pos[2] == 7 and state.reusable(2, 7) == 7 and state.reusable(2, 5) == 0
    state.free(2)
    assert not state.in_use[2] and state.reusable(2, 7) == 0
    state.alloc(2)
    assert not _row(state, 1, 0, 2).any()
    state.close()


def test_a_step_writes_new_states_beside_the_live_ones(backend):
    state = RecurrentState(backend, [LayerRecurrent((4,), backend.cpu)], n_seqs=2)
    state.alloc(1)
    _step(state, 1, 3, 2.0)
    rows = state.step_values(np.array([1]))
    assert rows["state_rows"][0] != rows["state_rows_out"][0]
    _fill_row(state, rows["state_rows_out"][0], 9.0)  # what the next step computes
    # the step failed: not advanced, the live state is as before it
    assert np.all(_row(state, 0, 0, 1) == 2.0) and state.pos[1] == 3
    state.advance([1], [5])                          # it succeeded: its states are live
    assert np.all(_row(state, 0, 0, 1) == 9.0) and state.pos[1] == 8
    state.close()


def test_a_saved_state_lets_a_sequence_go_back_to_it(backend):
    state = RecurrentState(backend, [LayerRecurrent((4,), backend.cpu)], n_seqs=2)
    state.alloc(0)
    _step(state, 0, 4, 1.0)
    state.snapshot([0])                              # saved at 4
    _step(state, 0, 5, 2.0)                          # now at 9
    assert [state.reusable(0, n) for n in (3, 4, 8, 9, 12)] == [0, 4, 4, 9, 9]
    state.copy(0, 1, 4)                              # another sequence continues from 4
    assert state.pos[1] == 4 and np.all(_row(state, 0, 0, 1) == 1.0)
    state.keep(0, 4)                                 # back to 4
    assert state.pos[0] == 4 and np.all(_row(state, 0, 0, 0) == 1.0)
    assert state.reusable(0, 9) == 4                 # what came after is gone
    state.close()


def test_a_sequence_keeps_its_last_saved_states(backend):
    """--ctx-checkpoints 3, states saved further apart than --checkpoint-min-step: the one
    furthest back gives way (llama-server's create_checkpoint)."""
    state = RecurrentState(backend, [LayerRecurrent((4,), backend.cpu)], n_seqs=1, max_snapshots=3)
    state.alloc(0)
    step = CHECKPOINT_MIN_STEP + 1
    for n in range(1, 5):
        _step(state, 0, step, float(n))
        state.snapshot([0])
    assert sorted(state.snaps[0]) == [2 * step, 3 * step, 4 * step]
    state.keep(0, 2 * step)
    assert np.all(_row(state, 0, 0, 0) == 2.0)
    state.close()


@pytest.mark.parametrize("min_step,held,then", [(CHECKPOINT_MIN_STEP, [100, 300, 400], [100, 300, 400, 500]),
                                                (0, [100, 200, 300, 400], [200, 300, 400, 500])])
def test_a_full_list_first_drops_an_earlier_requests_state_close_to_the_one_before_it(backend, min_step, held, then):
    """llama-server's create_checkpoint: with one free place left, states within
    --checkpoint-min-step of the one kept before them go first, unless the running request
    saved them (tests/test_checkpoint_spacing.py checks it against llama-server's log)."""
    state = RecurrentState(backend, [LayerRecurrent((4,), backend.cpu)], n_seqs=1, max_snapshots=4, min_step=min_step)
    state.alloc(0)
    for _ in range(3):                               # one request saves at 100, 200, 300
        _step(state, 0, 100, 1.0)
        state.snapshot([0])
    state.keep(0, 300)                               # the next one resumes at 300 (its own now)
    _step(state, 0, 100, 1.0)
    state.snapshot([0])
    assert sorted(state.snaps[0]) == held
    _step(state, 0, 100, 1.0)
    state.snapshot([0])                              # full: the one furthest back goes
    assert sorted(state.snaps[0]) == then
    state.close()


def test_saved_states_wait_in_host_ram_beside_two_rows_per_sequence(backend):
    """The state buffer holds each sequence's live row and the one a step writes; the
    --ctx-checkpoints copies (32 by default, llama-server's) are host bytes, as
    llama-server keeps its checkpoints."""
    state = RecurrentState(backend, [LayerRecurrent((4,), backend.cpu)], n_seqs=2)
    assert state.max_snapshots == CTX_CHECKPOINTS == 32
    assert state.tensors[(0, 0)].ne[1] == 2 * 2
    state.alloc(0)
    for n in range(40):
        _step(state, 0, 1, float(n))
        state.snapshot([0])
    assert len(state.snaps[0]) == 32 and state.snaps[0][40] == [np.full(4, 39.0, np.float32).tobytes()]
    state.close()


def test_ctx_checkpoints_zero_saves_no_state_on_a_prompts_way(backend):
    hybrid = Memory(backend, [LayerKV(8, 8, backend.cpu), LayerRecurrent((4,), backend.cpu)], kv_size=64,
                    n_seqs=1, type_k=ggml.F16, type_v=ggml.F16, checkpoints=0)
    assert hybrid.state_points(40, (0, 12, 30)) == ()
    hybrid.recurrent.alloc(0)
    hybrid.recurrent.snapshot([0])
    assert hybrid.recurrent.snaps[0] == {}
    hybrid.close()


@pytest.mark.parametrize("argv,env,n", [([], {}, 32), (["-ctxcp", "4"], {}, 4), (["--swa-checkpoints", "0"], {}, 0),
                                        ([], {"LLAMA_ARG_CTX_CHECKPOINTS": "7"}, 7),
                                        (["--ctx-checkpoints", "-1"], {}, 0)])
def test_ctx_checkpoints_flag_reads_as_llama_servers(smollm2_path, monkeypatch, argv, env, n):
    from ggserve.server.cli.main import config_from_args, serve_parser
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert config_from_args(serve_parser().parse_args(["-m", smollm2_path, *argv])).ctx_checkpoints == n


def test_a_prompts_state_is_saved_before_its_tail_and_at_user_turns(backend):
    hybrid = Memory(backend, [LayerKV(8, 8, backend.cpu), LayerRecurrent((4,), backend.cpu)], kv_size=64,
                    n_seqs=1, type_k=ggml.F16, type_v=ggml.F16)
    assert hybrid.state_points(40, (0, 12, 30)) == (12, 30, 36)      # as llama-server's checkpoints
    assert hybrid.state_points(3) == ()
    hybrid.close()
    attention_only = Memory(backend, [LayerKV(8, 8, backend.cpu)], kv_size=64, n_seqs=1,
                            type_k=ggml.F16, type_v=ggml.F16)
    assert attention_only.state_points(40, (12,)) == ()
    attention_only.close()


def test_a_hybrid_model_keeps_a_cached_prefix_only_where_it_has_its_state(backend):
    specs = [LayerKV(8, 8, backend.cpu), LayerRecurrent((4,), backend.cpu)]
    mem = Memory(backend, specs, kv_size=64, n_seqs=2, type_k=ggml.F16, type_v=ggml.F16)
    mem.keep(0, 0, 0)
    cells = mem.begin_step([0], [10], np.zeros(10, dtype=np.int64), np.arange(10, dtype=np.int32), None)
    mem.end_step([0], [10])
    assert len(cells) == 10 and mem.recurrent.pos[0] == 10
    assert mem.reusable(0, 10) == 10 and mem.reusable(0, 6) == 0
    assert mem.take_prefix(0, 1, 10, 10) and mem.recurrent.pos[1] == 10 and mem.n_used == 20
    # seq 0's state is not at 6: nothing is given, and seq 1 keeps what it has
    assert not mem.take_prefix(0, 1, 6, 6) and mem.recurrent.pos[1] == 10 and mem.n_used == 20
    mem.close()


def test_recurrent_layers_compute_runs_of_sequences_with_equal_row_counts():
    # three decodes, a 7-row prompt chunk, then two 1-row chunks: llama.cpp's equal splits
    seq_rows = ((0, 1), (1, 1), (2, 1), (3, 7), (10, 1), (11, 1))
    assert equal_blocks(seq_rows) == [(0, 1, 0, 3), (3, 7, 3, 1), (10, 1, 4, 2)]
