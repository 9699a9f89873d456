"""Partition arithmetic of spatial parallelism, checked without processes."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minidist.parallel.spatial.partition import AxisPartition, HaloPlan, intersect, length, split_bounds


def rows_read(o0, o1, kernel, stride, padding, n_in):
    """Input rows (inside the image) that output rows o0..o1-1 read."""
    return {r for o in range(o0, o1) for r in range(o * stride - padding, o * stride - padding + kernel)
            if 0 <= r < n_in}


@st.composite
def axis_cases(draw, max_parts=4):
    kernel, stride, padding = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.integers(0, 2))
    n_in = draw(st.integers(max(1, kernel - 2 * padding), 23))
    n_out = (n_in + 2 * padding - kernel) // stride + 1
    parts = draw(st.integers(1, min(max_parts, n_out)))
    return n_in, kernel, stride, padding, parts


@given(st.integers(0, 40), st.integers(1, 9))
def test_parallel_spatial_split_bounds_is_array_split(n, parts):
    sizes = [len(piece) for piece in np.array_split(np.arange(n), parts)]
    stops = np.cumsum(sizes).tolist()
    assert split_bounds(n, parts) == [(stop - size, stop) for size, stop in zip(sizes, stops, strict=True)]


@given(axis_cases())
def test_parallel_spatial_axis_windows_are_exactly_what_the_outputs_read(case):
    n_in, kernel, stride, padding, parts = case
    axis = AxisPartition.build(n_in, kernel, stride, padding, parts)
    assert axis.n_out == (n_in + 2 * padding - kernel) // stride + 1
    assert [length(o) for o in axis.out] == [len(a) for a in np.array_split(np.arange(axis.n_out), parts)]
    everything_read = rows_read(0, axis.n_out, kernel, stride, padding, n_in)
    union = set()
    rows = zip(axis.out, axis.window, axis.pad, strict=True)
    for i, ((o0, o1), (lo, hi), (before, after)) in enumerate(rows):
        # padding + clipped window = the full window, whose length the output rows need
        assert before + (hi - lo) + after == (o1 - o0 - 1) * stride + kernel
        assert 0 <= before <= padding and 0 <= after <= padding
        read = rows_read(o0, o1, kernel, stride, padding, n_in)
        full_lo, full_hi = o0 * stride - padding, (o1 - 1) * stride - padding + kernel
        assert (lo, hi) == (min(max(full_lo, 0), n_in), max(min(full_hi, n_in), min(max(full_lo, 0), n_in)))
        assert read <= set(range(lo, hi))
        union |= read
        h_before, h_after = axis.halo(i)
        assert (axis.own[i][0] - h_before, axis.own[i][1] + h_after) == (lo, hi)
    assert union == everything_read


def conv_plane(image, kernel_hw, stride_hw, padding_hw):
    """A single-plane 2-D correlation with a kernel of distinct integer weights (the reference)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel_hw, stride_hw, padding_hw
    weights = np.arange(1, kh * kw + 1, dtype=np.float64).reshape(kh, kw)
    padded = np.pad(image, ((ph, ph), (pw, pw)))
    out_h, out_w = (padded.shape[0] - kh) // sh + 1, (padded.shape[1] - kw) // sw + 1
    out = np.empty((out_h, out_w))
    for y in range(out_h):
        for x in range(out_w):
            out[y, x] = np.sum(padded[y * sh:y * sh + kh, x * sw:x * sw + kw] * weights)
    return out


def simulate_exchange(plan, image):
    """Walk plan.transfers as the ranks would, in one process, and return every rank's window."""
    pieces, tall, windows = {}, {}, {}
    for rank in range(plan.world_size):
        (r, c), (wr, wc) = plan.own_block(rank), plan.window_block(rank)
        pieces[rank] = image[r[0]:r[1], c[0]:c[1]]
        tall[rank] = np.full((length(wr), length(c)), np.nan)
        keep = intersect(r, wr)
        tall[rank][keep[0] - wr[0]:keep[1] - wr[0]] = image[keep[0]:keep[1], c[0]:c[1]]
    arrivals = {rank: np.zeros(tall[rank].shape, int) for rank in tall}
    for t in (t for t in plan.transfers if t.phase == 0):
        (sr, _), (dr, _) = plan.own_block(t.src), plan.window_block(t.dst)
        tall[t.dst][t.rows[0] - dr[0]:t.rows[1] - dr[0]] = pieces[t.src][t.rows[0] - sr[0]:t.rows[1] - sr[0]]
        arrivals[t.dst][t.rows[0] - dr[0]:t.rows[1] - dr[0]] += 1
    for rank in range(plan.world_size):
        (r, c), (wr, wc) = plan.own_block(rank), plan.window_block(rank)
        assert plan.window_block(rank)[0] == wr
        windows[rank] = np.full((length(wr), length(wc)), np.nan)
        keep = intersect(c, wc)
        windows[rank][:, keep[0] - wc[0]:keep[1] - wc[0]] = tall[rank][:, keep[0] - c[0]:keep[1] - c[0]]
        assert np.all(arrivals[rank][intersect(r, wr)[0] - wr[0]:intersect(r, wr)[1] - wr[0]] == 0)
    for t in (t for t in plan.transfers if t.phase == 1):
        (_, sc), (_, dc) = plan.own_block(t.src), plan.window_block(t.dst)
        assert plan.window_block(t.src)[0] == t.rows  # full height of the sender's phase-0 buffer
        windows[t.dst][:, t.cols[0] - dc[0]:t.cols[1] - dc[0]] = \
            tall[t.src][:, t.cols[0] - sc[0]:t.cols[1] - sc[0]]
    return windows


@st.composite
def grid_cases(draw):
    grid_h, grid_w = draw(st.sampled_from([(1, 1), (2, 1), (3, 1), (4, 1), (1, 2), (2, 2), (2, 3), (3, 2)]))
    kernel = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    hw = []
    for parts, k, s, p in zip((grid_h, grid_w), kernel, stride, padding, strict=True):
        smallest = max(1, k - 2 * p, (parts - 1) * s + k - 2 * p)  # enough output rows for every rank
        hw.append(draw(st.integers(smallest, smallest + 12)))
    return tuple(hw), kernel, stride, padding, (grid_h, grid_w)


@given(grid_cases())
def test_parallel_spatial_plan_assembles_every_window_and_local_convs_match(case):
    hw, kernel, stride, padding, grid = case
    plan = HaloPlan.build(hw, kernel, stride, padding, grid)
    image = np.random.default_rng(0).integers(-9, 10, size=hw).astype(np.float64)
    reference = conv_plane(image, kernel, stride, padding)
    assert reference.shape == plan.output_hw
    windows = simulate_exchange(plan, image)
    for rank in range(plan.world_size):
        (wr, wc), (orow, ocol) = plan.window_block(rank), plan.out_block(rank)
        np.testing.assert_array_equal(windows[rank], image[wr[0]:wr[1], wc[0]:wc[1]])
        (top, bottom), (left, right) = plan.padding_of(rank)
        padded = np.pad(windows[rank], ((top, bottom), (left, right)))
        local = conv_plane(padded, kernel, stride, (0, 0))
        np.testing.assert_array_equal(local, reference[orow[0]:orow[1], ocol[0]:ocol[1]])
        # the byte formula counts exactly what the transfers carry
        sent = sum(length(t.rows) * length(t.cols) for t in plan.transfers if t.src == rank)
        received = sum(length(t.rows) * length(t.cols) for t in plan.transfers if t.dst == rank)
        assert plan.halo_elements(rank) == (sent, received)
        # the steps hand every transfer of this rank out exactly once, one send and one receive a step
        stepped = [t for phase in (0, 1) for pair in plan.steps(rank, phase) for t in pair if t is not None]
        mine = [t for t in plan.transfers if rank in (t.src, t.dst)]
        assert sorted(stepped, key=repr) == sorted(mine, key=repr)
        for phase in (0, 1):
            for send, recv in plan.steps(rank, phase):
                assert (send is None or send.src == rank) and (recv is None or recv.dst == rank)
                assert send is None or recv is None or send.hop == recv.hop


def test_parallel_spatial_interior_rank_sends_four_messages_and_window_minus_interior():
    plan = HaloPlan.build((30, 30), 3, 1, 1, (3, 3))
    centre = 4
    assert plan.messages(centre) == (4, 4)
    h = w = 10
    assert plan.halo_elements(centre) == ((h + 2) * (w + 2) - h * w,) * 2
    assert plan.halo_bytes(centre, batch=2, channels=3, itemsize=8) == ((12 * 12 - 100) * 48,) * 2
    # a corner rank needs one side of each: 2 messages in, 2 out
    assert plan.messages(0) == (2, 2)
    assert plan.halo_elements(0) == (11 * 11 - 100,) * 2
    # a 5x5 kernel doubles the halo width
    plan5 = HaloPlan.build((30, 30), 5, 1, 2, (3, 3))
    assert plan5.halo_elements(centre)[1] == 14 * 14 - 100


@given(st.integers(1, 30), st.integers(1, 30), st.sampled_from([(1, 1), (4, 1), (2, 3), (1, 3)]))
def test_parallel_spatial_kernel_one_exchanges_nothing(height, width, grid):
    assume(grid[0] <= height and grid[1] <= width)
    plan = HaloPlan.build((height, width), 1, 1, 0, grid)
    assert plan.transfers == ()
    assert all(plan.halo_elements(r) == (0, 0) for r in range(plan.world_size))


def test_parallel_spatial_multi_hop_halo_reaches_past_the_neighbour():
    # 5 ranks own 1-2 rows each; a 5x5 kernel needs 2 rows on each side: rank 2 hears from 0,1,3,4
    plan = HaloPlan.build((6, 4), 5, 1, 2, (5, 1))
    assert {t.src for t in plan.transfers if t.dst == 2} == {0, 1, 3, 4}


def test_parallel_spatial_asymmetric_and_trimmed_halos():
    axis = AxisPartition.build(10, 3, 2, 0, 2)   # n_out 4: outputs [0,2) read rows 0..4, [2,4) rows 4..8
    assert axis.window == ((0, 5), (4, 9))
    assert axis.halo(0) == (0, 0) and axis.halo(1) == (1, -1)   # row 9 is owned by rank 1 but never read


@pytest.mark.parametrize("kwargs, message", [
    ({"input_hw": (5, 8), "kernel_size": 3, "grid": (4, 1)}, "only 3 rows"),
    ({"input_hw": (8, 5), "kernel_size": 3, "stride": 2, "grid": (1, 3)}, "only 2 columns"),
    ({"input_hw": (2, 8), "kernel_size": 3}, "larger than the padded input"),
    ({"input_hw": (8, 8), "kernel_size": 0}, "kernel_size must be an integer >= 1"),
    ({"input_hw": (8, 8), "kernel_size": 3, "stride": 0}, "stride must be"),
    ({"input_hw": (8, 8), "kernel_size": 3, "padding": -1}, "padding must be"),
    ({"input_hw": (8, 8), "kernel_size": 3, "grid": (0, 1)}, "number of ranks along H"),
    ({"input_hw": 8, "kernel_size": 3}, "input_hw must be a pair"),
])
def test_parallel_spatial_plan_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HaloPlan.build(**kwargs)
