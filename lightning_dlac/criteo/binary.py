"""Reading the binary layouts back, from their headers only: checks a loader runs before training starts.

:func:`check_criteo_binary` validates a stem's TorchRec ``.npy`` files, :func:`check_criteo_multi_hot` its MLPerf
multi-hot ``.npz``; :func:`read_npy_header` and :func:`read_multi_hot_layout` say where each array's bytes lie, so a
reader can ``pread`` (or memory-map) any rows in place. Every error names the file, the problem and the command
that re-creates it.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_dlac.criteo.format import (
    BINARY_OUTPUTS,
    MULTI_HOT_SUFFIX,
    MULTI_HOT_TABLES_MEMBER,
    SPARSE_COLUMNS,
    binary_paths,
    multi_hot_path,
)

__all__ = [
    "MultiHotMember",
    "check_criteo_binary",
    "check_criteo_multi_hot",
    "read_multi_hot_layout",
    "read_npy_header",
]


def read_npy_header(path: str | os.PathLike) -> tuple[int, tuple[int, ...], bool, np.dtype]:
    """Read a .npy file's header (version 1.0 or 2.0).

    Args:
        path: The file.

    Returns:
        ``(data offset, shape, fortran_order, dtype)``.

    Raises:
        ValueError: Not a .npy file (numpy's reason in the message).
    """
    fmt = np.lib.format
    with open(path, "rb") as f:
        version = fmt.read_magic(f)
        shape, fortran, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(f)
        return f.tell(), shape, fortran, dtype


def _npy_rows(path: Path, dtype: np.dtype, cols: int) -> int:
    """Rows of a .npy that must hold ``dtype`` ``[N, cols]``; an error naming the file and the problem otherwise."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found. Create it with `dlac preprocess criteo --output {path.parent} <TSV files>`."
        )
    size = path.stat().st_size
    try:
        header, shape, fortran, file_dtype = read_npy_header(path)
    except (ValueError, OSError, EOFError) as e:
        raise ValueError(f"{path} is not a valid .npy file ({e}); re-create it with `dlac preprocess criteo`.") from e
    if file_dtype != dtype:
        raise ValueError(f"{path} holds {file_dtype}, expected {dtype}; re-create it with `dlac preprocess criteo`.")
    if len(shape) != 2 or shape[1] != cols or fortran:
        raise ValueError(
            f"{path} has shape {shape}{' (Fortran order)' if fortran else ''}, expected a C-order [N, {cols}] array."
        )
    expected = header + shape[0] * cols * dtype.itemsize
    if size != expected:
        raise ValueError(
            f"{path} is {'truncated' if size < expected else 'longer than its header says'}: {size} bytes, expected"
            f" {expected} for {shape[0]} rows; re-create it with `dlac preprocess criteo`."
        )
    return int(shape[0])


def check_criteo_binary(directory: str | os.PathLike, stem: str) -> int:
    """Validate ``<stem>_{dense,sparse,labels}.npy`` in ``directory`` from their headers.

    Args:
        directory: The directory holding the files.
        stem: Their common stem (``"day_0"``, ``"train"``).

    Returns:
        The row count the three files share.

    Raises:
        FileNotFoundError: A file is missing.
        ValueError: Wrong dtype or shape, a truncated file, or row counts that differ between the three.
    """
    paths = binary_paths(directory, stem)
    rows = [_npy_rows(p, dtype, cols) for p, (_, dtype, cols) in zip(paths, BINARY_OUTPUTS)]
    if len(set(rows)) != 1:
        names = ", ".join(f"{p.name}: {n}" for p, n in zip(paths, rows))
        raise ValueError(f"{stem}: the dense, sparse and labels files disagree on the row count ({names}).")
    return rows[0]


@dataclass(frozen=True)
class MultiHotMember:
    """Where one feature's ``[rows, cols]`` ids lie inside a ``_sparse_multi_hot.npz``.

    The member is stored uncompressed, so the bytes at ``offset`` are the C-order array itself and can be read or
    memory-mapped in place.

    Args:
        name: The member's name, ``"0.npy"`` .. ``"25.npy"``.
        offset: Byte offset of the array's first element in the .npz file.
        rows: Rows of the array (samples).
        cols: Columns of the array (ids per sample).
        dtype: Its dtype (int32 or int64).
    """

    # The member's name, "0.npy" .. "25.npy".
    name: str
    # Byte offset of the array's first element in the .npz file.
    offset: int
    rows: int
    cols: int
    dtype: np.dtype


def read_multi_hot_layout(path: str | os.PathLike) -> tuple[list[MultiHotMember], list[int] | None]:
    """Read where the features' arrays lie in a ``<stem>_sparse_multi_hot.npz``, from its zip directory and headers.

    Args:
        path: The .npz file.

    Returns:
        The members ``"0"`` .. ``"25"``, in feature order, and the table sizes the file was materialised for
        (``None`` when it does not say, as in MLPerf's own files).

    Raises:
        FileNotFoundError: The file is missing.
        ValueError: Not a zip, a member missing or compressed (``np.savez_compressed``), not a C-order 2-D int32 or
            int64 array, or shorter than its header says.
    """
    import zipfile

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found.")
    fix = "re-create it with `dlac preprocess criteo --multi-hot-sizes ...` (docs/data.md)"
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"{path} is not a valid .npz (zip) file ({e}); {fix}.") from e
    members: list[MultiHotMember] = []
    tables: list[int] | None = None
    with zf, path.open("rb") as f:
        for t in [*range(SPARSE_COLUMNS), MULTI_HOT_TABLES_MEMBER]:
            name = f"{t}.npy"
            try:
                info = zf.getinfo(name)
            except KeyError:
                if t == MULTI_HOT_TABLES_MEMBER:
                    continue
                raise ValueError(
                    f"{path} has no member {name!r} (the ids of feature cat_{t}); a multi-hot .npz holds one array per"
                    f" feature, named '0' .. '{SPARSE_COLUMNS - 1}' as MLPerf's materialisation writes them; {fix}."
                ) from None
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(
                    f"{path}: member {name!r} is compressed (np.savez_compressed?); its arrays must be stored"
                    f" uncompressed (np.savez) to be read in place; {fix}."
                )
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"{path}: member {name!r} has no valid local header; {fix}.")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            f.seek(start)
            try:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(f)
            except (ValueError, OSError, EOFError) as e:
                raise ValueError(f"{path}: member {name!r} is not a .npy array ({e}); {fix}.") from e
            offset = f.tell()
            if t == MULTI_HOT_TABLES_MEMBER:
                f.seek(offset)
                tables = np.frombuffer(f.read(8 * SPARSE_COLUMNS), dtype="<i8").tolist()
                if shape != (SPARSE_COLUMNS,) or dtype != np.dtype("<i8") or len(tables) != SPARSE_COLUMNS:
                    raise ValueError(f"{path}: member {name!r} is not {SPARSE_COLUMNS} int64 table sizes; {fix}.")
                continue
            if dtype not in (np.dtype("<i4"), np.dtype("<i8")) or len(shape) != 2 or fortran:
                raise ValueError(
                    f"{path}: member {name!r} holds {dtype} {list(shape)}{' (Fortran order)' if fortran else ''};"
                    f" expected C-order [rows, ids per row] int32 (MLPerf's) or int64; {fix}."
                )
            expected = offset - start + shape[0] * shape[1] * dtype.itemsize
            if info.file_size != expected or start + info.file_size > path.stat().st_size:
                raise ValueError(
                    f"{path}: member {name!r} is {info.file_size} bytes, {expected} expected for {list(shape)}"
                    f" {dtype} (a truncated file?); {fix}."
                )
            members.append(MultiHotMember(name, offset, int(shape[0]), int(shape[1]), dtype))
    return members, tables


def check_criteo_multi_hot(
    directory: str | os.PathLike,
    stem: str,
    multi_hot_sizes: Sequence[int],
    num_embeddings_per_feature: Sequence[int],
) -> tuple[int, list[MultiHotMember]]:
    """Validate a multi-hot set's files (headers only) against the expected pooling factors and table sizes.

    The files are ``<stem>_{dense,labels}.npy`` and ``<stem>_sparse_multi_hot.npz`` in ``directory``.

    Args:
        directory: The directory holding the files.
        stem: Their common stem.
        multi_hot_sizes: The ids per row of each feature the .npz must hold.
        num_embeddings_per_feature: The table sizes it must have been materialised for.

    Returns:
        The row count and the features' arrays in the .npz.

    Raises:
        FileNotFoundError: A file is missing (the message says how to create the .npz).
        ValueError: A bad file, row counts that differ, ids per row other than ``multi_hot_sizes``, or a file
            materialised for other table sizes than ``num_embeddings_per_feature``.
    """
    dense, sparse, labels = binary_paths(directory, stem)
    npz = multi_hot_path(directory, stem)
    sizes = ",".join(str(int(p)) for p in multi_hot_sizes)
    tables = ",".join(str(int(n)) for n in num_embeddings_per_feature)
    create = (
        f"dlac preprocess criteo --output {Path(directory)} --multi-hot-sizes {sizes}"
        f" --num-embeddings-per-feature {tables} {sparse}"
    )
    if not npz.is_file():
        raise FileNotFoundError(
            f"{npz} not found: with multi_hot_sizes set, the multi-hot ids of {stem!r} are read from"
            f" <stem>_{MULTI_HOT_SUFFIX}.npz (MLPerf DLRM v2's layout). Materialise it from the one-hot day with"
            f" `{create}`, or leave multi_hot_sizes unset to read the one-hot {sparse.name}."
        )
    outputs = (BINARY_OUTPUTS[0], BINARY_OUTPUTS[2])
    rows = [_npy_rows(p, dtype, cols) for p, (_, dtype, cols) in zip((dense, labels), outputs)]
    members, file_tables = read_multi_hot_layout(npz)
    counts = {dense.name: rows[0], labels.name: rows[1], **{f"{npz.name}:{m.name}": m.rows for m in members}}
    if len(set(counts.values())) != 1:
        names = ", ".join(f"{k}: {v}" for k, v in counts.items() if v != rows[0] or k == dense.name)
        raise ValueError(f"{stem}: the dense, labels and multi-hot files disagree on the row count ({names}).")
    file_sizes = [m.cols for m in members]
    if file_sizes != [int(p) for p in multi_hot_sizes]:
        bad = [(f"cat_{t}", want, got) for t, (want, got) in enumerate(zip(multi_hot_sizes, file_sizes)) if want != got]
        raise ValueError(
            f"{npz} holds {file_sizes} ids per row, but multi_hot_sizes is {[int(p) for p in multi_hot_sizes]}"
            f" ((feature, multi_hot_sizes, file): {bad}). Set multi_hot_sizes to the file's (on the command line:"
            f" --data.multi_hot_sizes=[{','.join(map(str, file_sizes))}]), or re-materialise with `{create}`."
        )
    if file_tables is not None and file_tables != [int(n) for n in num_embeddings_per_feature]:
        raise ValueError(
            f"{npz} was materialised for tables of {file_tables} rows, but num_embeddings_per_feature is"
            f" {[int(n) for n in num_embeddings_per_feature]}: its ids would not index these tables as drawn. Set"
            " num_embeddings_per_feature to the file's"
            f" (--data.num_embeddings_per_feature=[{','.join(map(str, file_tables))}])"
            f" or re-materialise with `{create} --overwrite`."
        )
    return rows[0], members
