"""Multi-hot: MLPerf DLRM v2's bags of ids, as a function of the one-hot id, and their materialisation on disk.

:func:`multi_hot_from_one_hot` is the construction (shared with ``SyntheticCriteoDataModule(multi_hot_sizes=...)``);
:func:`materialize_multi_hot` applies it to converted one-hot days, ``<stem>_sparse.npy`` to MLPerf's
``<stem>_sparse_multi_hot.npz`` (one int32 ``[N, P_t]`` array per feature, members ``"0"`` .. ``"25"``, stored
uncompressed as ``np.savez`` stores them), streamed in blocks; :func:`lightning_dlac.criteo.check_criteo_multi_hot` is
the loader's check of those files.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_dlac.criteo.binary import check_criteo_binary, read_npy_header
from lightning_dlac.criteo.format import (
    MULTI_HOT_TABLES_MEMBER,
    SPARSE_COLUMNS,
    binary_paths,
    check_per_feature,
    multi_hot_path,
)
from lightning_dlac.criteo.writers import ZIP_DATE_TIME, StoredZipWriter, npy_header, pwrite_all

if TYPE_CHECKING:
    import torch

__all__ = ["MULTI_HOT_BLOCK_ROWS", "MultiHotMaterialization", "materialize_multi_hot", "multi_hot_from_one_hot"]

# Rows materialised per block: about 215 ids per row with MLPerf's pooling factors, so a block's ids and the hash's
# temporaries (one table at a time) stay well under 100 MiB per worker.
MULTI_HOT_BLOCK_ROWS = 8192
_HASH_MASK = (1 << 62) - 1


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer on int64 (wrapping arithmetic), masked to 62 non-negative bits."""
    x = x ^ (x >> 30)  # arithmetic shifts on negatives differ from SplitMix's logical ones; still a fixed bijection
    x = x * -4658895280553007687  # 0xbf58476d1ce4e5b9 as a signed int64
    x = x ^ (x >> 27)
    x = x * -7723592293110705685  # 0x94d049bb133111eb
    x = x ^ (x >> 31)
    return x & _HASH_MASK


def multi_hot_from_one_hot(
    ids: torch.Tensor, multi_hot_sizes: Sequence[int], num_embeddings_per_feature: Sequence[int], salt: int = 0
) -> torch.Tensor:
    """Expand one-hot categorical ids into multi-hot bags the way MLPerf DLRM v2 materialises Criteo 1TB.

    The bag of id ``i`` of table ``t`` is ``[i, h(t, i, 1), ..., h(t, i, P_t - 1)]``, a fixed function of ``i``,
    with the extra ids uniform over the table (MLPerf draws them once per id into a table; a hash needs no ``n x P``
    table, so full-size tables cost nothing).

    Args:
        ids: One-hot ids ``[F, B]`` (table-major, as a KeyedJaggedTensor with one id per sample holds them).
        multi_hot_sizes: Ids per bag of each table (:data:`MLPERF_MULTI_HOT_SIZES` for DLRM v2).
        num_embeddings_per_feature: Rows of each table; the extra ids lie in ``[0, rows)``.
        salt: Seed of the hash (the same on every rank, so ranks expand ids alike).

    Returns:
        KeyedJaggedTensor values: table ``t``'s ``B * P_t`` ids (sample-major), tables concatenated in order.

    Raises:
        ValueError: If ``ids`` is not 2-D or its tables, the sizes and the table sizes differ in number.
    """
    import torch

    if ids.dim() != 2 or ids.size(0) != len(multi_hot_sizes) or len(multi_hot_sizes) != len(num_embeddings_per_feature):
        raise ValueError(
            f"ids must be [tables, batch] with one multi_hot_sizes and num_embeddings_per_feature entry per table;"
            f" got ids {list(ids.shape)}, {len(multi_hot_sizes)} sizes, {len(num_embeddings_per_feature)} tables."
        )
    ids = ids.long()
    bags = []
    for table, (pool, rows) in enumerate(zip(multi_hot_sizes, num_embeddings_per_feature)):
        one = ids[table].unsqueeze(1)  # [B, 1]: slot 0 of every bag
        if int(pool) > 1:
            slot = torch.arange(1, int(pool), dtype=torch.int64)  # slots 1 .. P - 1, broadcast over the samples
            extra = _mix64(((one * 1_000_003 + table) * 1_009 + slot) ^ salt) % int(rows)
            one = torch.cat([one, extra], dim=1)
        bags.append(one.reshape(-1))  # [B * P], sample-major
    return torch.cat(bags) if bags else ids.new_empty(0)


@dataclass(frozen=True)
class MultiHotMaterialization:
    """What :func:`materialize_multi_hot` wrote for one day.

    Args:
        source: The one-hot ``<stem>_sparse.npy`` read.
        stem: The day's stem.
        rows: Rows materialised.
        seconds: Wall time, seconds.
        path: The ``<stem>_sparse_multi_hot.npz`` written.
    """

    # The one-hot ``<stem>_sparse.npy`` read.
    source: Path
    stem: str
    rows: int
    # Wall time, seconds.
    seconds: float
    # The ``<stem>_sparse_multi_hot.npz`` written.
    path: Path

    @property
    def rows_per_second(self) -> float:
        """Rows materialised per second."""
        return self.rows / self.seconds if self.seconds > 0 else float("inf")


def _materialize_one(
    source_dir: Path,
    stem: str,
    output_dir: Path,
    sizes: list[int],
    tables: list[int],
    workers: int,
    block_rows: int,
    overwrite: bool,
    progress: bool,
) -> MultiHotMaterialization:
    import torch

    t0 = time.perf_counter()
    rows = check_criteo_binary(source_dir, stem)
    sparse_path = binary_paths(source_dir, stem)[1]
    final = multi_hot_path(output_dir, stem)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists; pass --overwrite (overwrite=True) to replace it.")
    if output_dir.resolve() != source_dir.resolve():
        _place_dense_and_labels(source_dir, output_dir, stem, overwrite)
    names = [f"{t}.npy" for t in range(SPARSE_COLUMNS)] + [f"{MULTI_HOT_TABLES_MEMBER}.npy"]
    int32, int64 = np.dtype("<i4"), np.dtype("<i8")
    headers = [npy_header(int32, (rows, p)) for p in sizes]
    meta = np.asarray(tables, dtype=int64)
    headers.append(npy_header(int64, meta.shape))
    member_sizes = [len(h) + rows * p * 4 for h, p in zip(headers, sizes)] + [len(headers[-1]) + meta.nbytes]
    partial = final.with_name(final.name + ".partial")
    fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    src = os.open(sparse_path, os.O_RDONLY)
    try:
        src_start = read_npy_header(sparse_path)[0]
        zw = StoredZipWriter(fd, names, member_sizes, ZIP_DATE_TIME)
        os.ftruncate(fd, zw.end_of_data)
        for k, header in enumerate(headers):
            pwrite_all(fd, header, zw.member_offset(k))
            zw.update_crc(k, header)
        pwrite_all(fd, meta.tobytes(), zw.member_offset(len(names) - 1) + len(headers[-1]))
        zw.update_crc(len(names) - 1, meta.tobytes())
        hashes = np.asarray(tables, dtype=np.int64)
        row_bytes = SPARSE_COLUMNS * 8

        def block(lo: int) -> list[np.ndarray]:
            n = min(block_rows, rows - lo)
            data = os.pread(src, n * row_bytes, src_start + lo * row_bytes)
            if len(data) != n * row_bytes:
                raise OSError(f"short read from {sparse_path} at row {lo}: the file changed while reading?")
            one_hot = np.frombuffer(data, dtype=np.int64).reshape(n, SPARSE_COLUMNS) % hashes
            ids = torch.from_numpy(np.ascontiguousarray(one_hot.T))
            values = multi_hot_from_one_hot(ids, sizes, tables).to(torch.int32).numpy()
            parts = np.split(values, np.cumsum([p * n for p in sizes])[:-1])  # feature t: its [n, P_t] ids
            for t, part in enumerate(parts):
                pwrite_all(fd, part, zw.member_offset(t) + len(headers[t]) + lo * sizes[t] * 4)
            return parts

        from tqdm import tqdm

        bar = tqdm(total=rows, unit="rows", unit_scale=True, desc=f"{stem} multi-hot", disable=not progress,
                   file=sys.stderr, smoothing=0.1, mininterval=0.5)  # fmt: skip
        starts = list(range(0, rows, block_rows))
        try:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                # A bounded window of blocks in flight; their CRCs are folded in row order as they complete.
                pending: list[Any] = []
                nxt = 0
                try:
                    while nxt < len(starts) or pending:
                        while nxt < len(starts) and len(pending) < 2 * workers:
                            pending.append((starts[nxt], pool.submit(block, starts[nxt])))
                            nxt += 1
                        lo, fut = pending.pop(0)
                        for t, part in enumerate(fut.result()):
                            zw.update_crc(t, part)
                        bar.update(min(block_rows, rows - lo))
                except BaseException:
                    for _, fut in pending:  # a failed block or Ctrl-C: start no more; the pool waits for the rest
                        fut.cancel()
                    raise
        finally:
            bar.close()
        length = zw.finish()
        os.ftruncate(fd, length)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(partial, final)
    finally:
        os.close(src)
        if fd >= 0:
            os.close(fd)
        if partial.exists():
            partial.unlink()
    return MultiHotMaterialization(sparse_path, stem, rows, time.perf_counter() - t0, final)


def _place_dense_and_labels(source_dir: Path, output_dir: Path, stem: str, overwrite: bool) -> None:
    """Hard-link (or copy, across file systems) ``<stem>_{dense,labels}.npy`` next to the .npz: the loader reads a
    day's three files from one directory."""
    src_dense, _, src_labels = binary_paths(source_dir, stem)
    dst_dense, _, dst_labels = binary_paths(output_dir, stem)
    for src, dst in ((src_dense, dst_dense), (src_labels, dst_labels)):
        if dst.exists():
            if dst.samefile(src):
                continue
            if not overwrite:
                raise FileExistsError(f"{dst} already exists; pass --overwrite (overwrite=True) to replace it.")
            dst.unlink()
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)


def materialize_multi_hot(
    sparse_files: Sequence[str | os.PathLike],
    output_dir: str | os.PathLike,
    multi_hot_sizes: Sequence[int],
    num_embeddings_per_feature: Sequence[int],
    workers: int = 1,
    overwrite: bool = False,
    progress: bool = True,
    block_rows: int = MULTI_HOT_BLOCK_ROWS,
) -> list[MultiHotMaterialization]:
    """Materialise MLPerf DLRM v2's multi-hot ids from one-hot Criteo days, into ``<stem>_sparse_multi_hot.npz``.

    The inputs are ``<stem>_sparse.npy`` files.

    As MLPerf's ``materialize_synthetic_multihot_dataset.py`` (torchrec_dlrm) does, feature ``t``'s one-hot id ``i``
    (taken modulo ``num_embeddings_per_feature[t]``) becomes the bag ``[i, e_1, ..., e_{P-1}]`` of
    ``P = multi_hot_sizes[t]`` ids, a fixed function of ``i`` whose extra ids are uniform over the table, and the
    file holds one int32 ``[rows, P]`` array per feature, members ``"0"`` .. ``"25"``, stored uncompressed as
    ``np.savez`` stores them (MLPerf's readers memory-map them in place). The bags come from
    :func:`multi_hot_from_one_hot` (a hash: no ``rows x P`` lookup table, 31 GB for MLPerf's largest), so they are
    the same distribution as MLPerf's files but not the same ids. One more member, ``num_embeddings_per_feature``,
    records the table sizes, which ``CriteoBinaryDataModule`` checks.

    The day is read and written in blocks of ``block_rows`` rows (``workers`` at a time), so memory stays near
    ``workers x 100 MiB`` whatever the day's size; the output is written as ``<name>.partial``, flushed and renamed.
    When ``output_dir`` is not the input's directory the day's dense and labels files are hard-linked (or copied)
    there too, so the directory holds everything the loader reads.

    Args:
        sparse_files: One-hot ``<stem>_sparse.npy`` files written by :func:`preprocess_criteo` (or TorchRec's
            converter); the day's dense and labels files must sit beside each.
        output_dir: Directory for the ``.npz`` files (created if missing).
        multi_hot_sizes: Ids per bag of each of the 26 features (MLPerf: :data:`MLPERF_MULTI_HOT_SIZES`).
        num_embeddings_per_feature: Rows of each table (MLPerf: :data:`MLPERF_NUM_EMBEDDINGS_PER_FEATURE`).
        workers: Threads, each materialising its own blocks.
        overwrite: Replace existing outputs instead of refusing.
        progress: Show a progress bar on stderr.
        block_rows: Rows per block.

    Returns:
        One :class:`MultiHotMaterialization` per input, in order.

    Raises:
        ValueError: If the sizes are not 26 values of at least 1, a table exceeds int32 ids, ``workers`` or
            ``block_rows`` is below 1, no input is given, an input is not a ``<stem>_sparse.npy``, two inputs share
            a stem, or an input's files are invalid.
        FileNotFoundError: If an input's dense, sparse or labels file is missing.
        FileExistsError: If an output exists and ``overwrite`` is False.
    """
    sizes = check_per_feature(multi_hot_sizes, "multi_hot_sizes")
    tables = check_per_feature(num_embeddings_per_feature, "num_embeddings_per_feature")
    if max(tables) > 2**31 - 1:
        raise ValueError(f"num_embeddings_per_feature above 2**31 - 1 do not fit the int32 ids; got {max(tables)}.")
    if workers < 1 or block_rows < 1:
        raise ValueError(f"workers and block_rows must be at least 1, got {workers} and {block_rows}.")
    paths = [Path(p).expanduser() for p in sparse_files]
    if not paths:
        raise ValueError("no input files given.")
    stems = []
    for p in paths:
        if not p.name.endswith("_sparse.npy"):
            raise ValueError(f"{p} is not a one-hot <stem>_sparse.npy file (from `dlac preprocess criteo`).")
        stems.append(p.name[: -len("_sparse.npy")])
    dupes = sorted({s for s in stems if stems.count(s) > 1})
    if dupes:
        raise ValueError(f"several inputs share the stem {dupes[0]!r}; materialise them into different --output.")
    out = Path(output_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    return [
        _materialize_one(p.parent, stem, out, sizes, tables, workers, block_rows, overwrite, progress)
        for p, stem in zip(paths, stems)
    ]
