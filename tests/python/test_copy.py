"""kvpool._kvpool.copy_buffer_runs, the page copies of the engine adapters: every run lands where its
row says, whatever the thread count and size (streaming stores above 4 MiB), each run checked
against its buffers before anything is copied, bad tables refused with ValueError."""
import numpy as np
import pytest

from kvpool._kvpool import copy_buffer_runs


def rows(*r):
    return np.array(r, dtype=np.int64).reshape(-1, 5)


@pytest.mark.parametrize("threads", [1, 2, 5])
@pytest.mark.parametrize("chunk", [7, 4096, 32768 + 3])
def test_scatter_gather_round_trip(threads, chunk):
    """Pages of two source buffers scattered into a page-first host buffer and back, with odd
    sizes and unaligned offsets; above 4 MiB in all the copies stream and split."""
    rng = np.random.default_rng(chunk * threads)
    pages = max(8, (6 << 20) // (2 * chunk)) if chunk > 4096 else 64
    src = [rng.integers(0, 256, pages * chunk, dtype=np.uint8) for _ in range(2)]
    host = np.zeros(2 * pages * chunk + 1, dtype=np.uint8)
    perm = rng.permutation(pages)
    table = rows(*[(0, 1 + (perm[p] * 2 + k) * chunk, k, p * chunk, chunk)
                   for k in range(2) for p in range(pages)])
    assert copy_buffer_runs([host], src, table, threads) == 2 * pages * chunk
    h = host[1:].reshape(pages, 2, chunk)
    for k in range(2):
        assert np.array_equal(h[perm, k], src[k].reshape(pages, chunk))
    back = [np.zeros_like(s) for s in src]
    assert copy_buffer_runs(back, [host], table[:, [2, 3, 0, 1, 4]].copy(), threads) == \
        2 * pages * chunk
    for k in range(2):
        assert np.array_equal(back[k], src[k])


def test_one_large_run_split_over_threads():
    a = np.arange(9 << 20, dtype=np.uint8)
    b = np.zeros_like(a)
    assert copy_buffer_runs([b], [a], rows((0, 0, 0, 0, a.size)), 4) == a.size
    assert np.array_equal(a, b)


def test_empty_table_copies_nothing():
    a, b = np.ones(16, np.uint8), np.zeros(16, np.uint8)
    assert copy_buffer_runs([b], [a], np.zeros((0, 5), np.int64)) == 0
    assert not b.any()


@pytest.mark.parametrize("bad", [
    (1, 0, 0, 0, 4),      # no dst buffer 1
    (0, 0, -1, 0, 4),     # negative src index
    (0, 13, 0, 0, 4),     # past the end of dst
    (0, 0, 0, 15, 2),     # past the end of src
    (0, -1, 0, 0, 1),     # negative offset
    (0, 0, 0, 0, -1),     # negative size
    (0, 0, 0, 0, 1 << 62),
])
def test_runs_outside_their_buffers_are_refused_before_any_copy(bad):
    a, b = np.ones(16, np.uint8), np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match="outside"):
        copy_buffer_runs([b], [a], rows((0, 0, 0, 0, 8), bad))
    assert not b.any()  # the good first run was not copied either


def test_bad_arguments():
    a, b = np.ones(16, np.uint8), np.zeros(16, np.uint8)
    with pytest.raises(ValueError, match="int64"):
        copy_buffer_runs([b], [a], np.zeros((1, 5), np.int32))
    with pytest.raises(ValueError, match="int64"):
        copy_buffer_runs([b], [a], np.zeros((1, 4), np.int64))
    with pytest.raises(ValueError, match="threads"):
        copy_buffer_runs([b], [a], rows((0, 0, 0, 0, 1)), 0)
    with pytest.raises(ValueError, match="buffers"):
        copy_buffer_runs([], [a], rows((0, 0, 0, 0, 1)))
    with pytest.raises(BufferError):  # a read-only destination
        copy_buffer_runs([bytes(16)], [a], rows((0, 0, 0, 0, 1)))
    with pytest.raises((BufferError, ValueError), match="contig"):  # not contiguous
        copy_buffer_runs([np.zeros(32, np.uint8)[::2]], [a], rows((0, 0, 0, 0, 1)))


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_groups_are_reported_in_order_each_after_its_bytes_landed(threads):
    """A layer-wise load's call: 8 groups of 3 MiB (48 runs of 64 KiB each, taken from the
    source in a shuffled order), and two empty groups; done(g) sees every byte of group g in
    place, and groups come in order, each once."""
    rng = np.random.default_rng(threads)
    run, per, groups = 64 << 10, 48, 8
    src = rng.integers(0, 256, groups * per * run, dtype=np.uint8)
    dst = np.zeros_like(src)
    order = rng.permutation(groups * per)
    table = rows(*[(0, i * run, 0, int(order[i]) * run, run) for i in range(groups * per)])
    ends = [0] + [per * (g + 1) for g in range(groups)] + [groups * per]  # empty first, last
    seen = []

    def done(g):
        lo, hi = ([0] + ends)[g], ends[g]
        for i in range(lo, hi):
            s = int(order[i]) * run
            assert np.array_equal(dst[i * run:(i + 1) * run], src[s:s + run]), (g, i)
        seen.append(g)

    assert copy_buffer_runs([dst], [src], table, threads, ends=ends, done=done) == src.size
    assert seen == list(range(len(ends)))


def test_an_exception_from_done_stops_the_copy():
    """With one thread the copy stops at the piece after the failing report: the groups after
    it are not copied, and the exception comes out of the call."""
    a = np.ones(8 << 20, np.uint8)
    b = np.zeros_like(a)
    table = rows(*[(0, g << 21, 0, g << 21, 2 << 20) for g in range(4)])

    def done(g):
        raise RuntimeError(f"group {g} failed")

    with pytest.raises(RuntimeError, match="group 0 failed"):
        copy_buffer_runs([b], [a], table, 1, ends=[1, 2, 3, 4], done=done)
    assert b[:2 << 20].all() and not b[2 << 20:].any()


def test_an_empty_transfer_in_groups_reports_every_group():
    a, b = np.ones(16, np.uint8), np.zeros(16, np.uint8)
    seen = []
    assert copy_buffer_runs([b], [a], np.zeros((0, 5), np.int64), 2, ends=[0, 0],
                            done=seen.append) == 0
    assert seen == [0, 1]


def test_bad_groups():
    a, b = np.ones(16, np.uint8), np.zeros(16, np.uint8)
    two = rows((0, 0, 0, 0, 4), (0, 4, 0, 4, 4))
    for ends, match in (([2, 1, 2], "ascend"), ([1], "ascend"), ([3], "ascend"),
                        ([-1, 2], "ascend"), ([], "groups")):
        with pytest.raises(ValueError, match=match):
            copy_buffer_runs([b], [a], two, ends=ends, done=lambda g: None)
    with pytest.raises(TypeError, match="together"):
        copy_buffer_runs([b], [a], two, ends=[2])
    with pytest.raises(TypeError, match="together"):
        copy_buffer_runs([b], [a], two, done=lambda g: None)
    with pytest.raises(TypeError, match="callable"):
        copy_buffer_runs([b], [a], two, ends=[2], done=3)
    with pytest.raises(TypeError):
        copy_buffer_runs([b], [a], two, ends=["x"], done=lambda g: None)
    assert not b.any()
