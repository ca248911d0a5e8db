"""Table-wise calibration statistics, measured on the real pooled-embedding payload.

For every table, over the chunks it sent during calibration (every destination rank, every calibration batch, and
every rank once the statistics are reduced across ranks through :meth:`CalibrationStats.to_tensors`):

- the value range (min and max over its chunks);
- the **homogenization index** at the index bound, two ways. The paper's (*vector*, the default that classifies):
  distinct quantized vectors / distinct raw vectors, quantizing with the chunk's own range exactly as the codec does;
  1 means the bound keeps every distinct embedding distinct, a low index means the error merges embeddings, so the
  table needs a tighter bound. It only moves for tables whose raw vectors repeat or lie within one bin of each other
  in every coordinate (each table's index in a run: docs/benchmarks.md, 'Adaptive error bounds: accuracy and
  traffic', its per-table calibration). The *value* index counts per
  embedding coordinate (column) and sums over columns (distinct quantized values / distinct raw values), so it also
  sees tables whose vectors all stay distinct; it puts more tables tight (``DLACCallback(index="value")``). Both are
  measured and reported (:attr:`TableStats.homogenization_index`, :attr:`TableStats.vector_homogenization_index`);
- the compressed size at every candidate bound (the real codec's output), hence the ratio each bound would buy;
- the **gradient sensitivity** (beyond the paper; what ``mode="gradient"`` classifies by): the root mean square, over
  samples, of the change of each sample's loss that the codec's error on this table causes, to first order, relative
  to the mean loss. It needs no extra forward pass: the gradient exchange already carries every sample's loss
  gradient ``g`` with respect to the table's pooled embedding, and the codec's error is uniform within ``eps x range``
  of the chunk (``range``: its max - min), independent per element, so the first-order change ``g . error`` has
  variance ``(eps x range)**2 / 3 x |g|**2``. Summed over a table's column blocks and averaged over the samples of
  the calibration batches (``grad_energy / grad_rows``), its square root times ``eps`` over the mean loss is the
  statistic: an expected value, not one random draw, so it is steady from a few batches on. Per-sample gradients are
  ``rows x`` the gradient of the batch loss, which assumes the loss is a mean over this rank's batch (the usual
  ``reduction="mean"``);
- the **noise share** (beyond the paper; what ``mode="noise"`` chooses by): the variance the codec's error at each
  candidate bound adds to a batch's loss (the same first-order term, over the batch's samples) as a share of the
  variance of the training loss from batch to batch (``loss_sq_sum`` beside ``loss_sum``): free of the loss's scale
  and offset and of the batch size (:meth:`TableStats.noise_share`);
- the **probe sensitivity** (beyond the paper): the change of the training loss when only this table's pooled embeddings
  carry the codec's error at a candidate bound, everything else exact, over probe batches and ranks. The codec's
  error is zero-mean to first order, so the *signed* loss change of a batch is mostly ``gradient . error``, whose
  sign is noise and whose mean over batches tends to the (tiny) second-order term: one batch's signed change says
  little. Its *magnitude* is what grows with the table's influence on the loss (``|gradient| x bound x range``), so
  the probe keeps the sum of squared changes and the measure is their root mean square.

Every statistic is a sum, a minimum or a maximum, so ranks combine them with three all-reduces and all end with the
same numbers (and the same bounds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from lightning_dlac.adaptive.bounds import check_relative_bound
from lightning_dlac.codec import encode
from lightning_dlac.codec import reference as ref
from lightning_dlac.codec.format import Mode


def distinct_rows(x: torch.Tensor) -> int:
    """Count the distinct rows of a 2-D tensor.

    Args:
        x: The tensor.

    Returns:
        How many distinct rows it has (0 if it is empty).
    """
    if x.numel() == 0:
        return 0
    return int(torch.unique(x, dim=0).shape[0])


def homogenization_counts(chunk: torch.Tensor, eps: float) -> tuple[int, int]:
    """Count one chunk's distinct rows before and after quantization at relative bound ``eps``.

    The chunk is quantized exactly as the codec quantizes it (relative to the chunk's own value range).

    Args:
        chunk: One float32 ``[rows, dim]`` chunk.
        eps: The relative bound.

    Returns:
        ``(distinct raw rows, distinct quantized rows)``.
    """
    chunk = chunk.detach().float().contiguous()
    raw = distinct_rows(chunk)
    if raw == 0:
        return 0, 0
    mode, q = ref.quantize(chunk, eps, True)
    if mode is Mode.CONST:
        return raw, 1
    if mode is Mode.RAW:
        return raw, raw  # sent exactly: nothing is merged
    return raw, distinct_rows(q[3].view(chunk.shape))


def _distinct_per_column(x: torch.Tensor) -> int:
    """Number of distinct values in each column of a 2-D tensor, summed over columns."""
    if x.numel() == 0:
        return 0
    ordered = torch.sort(x, dim=0).values
    return int(x.shape[1] + (ordered[1:] != ordered[:-1]).sum())


def value_homogenization_counts(chunk: torch.Tensor, eps: float) -> tuple[int, int]:
    """Count one chunk's distinct values per column before and after quantization at relative bound ``eps``.

    The chunk is quantized exactly as the codec quantizes it (relative to the chunk's own value range); the counts
    are per column, summed over columns.

    Args:
        chunk: One float32 ``[rows, dim]`` chunk.
        eps: The relative bound.

    Returns:
        ``(distinct raw values, distinct quantized values)``.
    """
    chunk = chunk.detach().float().contiguous()
    raw = _distinct_per_column(chunk)
    if raw == 0:
        return 0, 0
    mode, q = ref.quantize(chunk, eps, True)
    if mode is Mode.CONST:
        return raw, chunk.shape[1]
    if mode is Mode.RAW:
        return raw, raw  # sent exactly: nothing is merged
    return raw, _distinct_per_column(q[3].view(chunk.shape))


def homogenization_index(chunk: torch.Tensor, eps: float) -> float:
    """The paper's, whole-vector homogenization index of one chunk at relative bound ``eps``.

    Args:
        chunk: One float32 ``[rows, dim]`` chunk.
        eps: The relative bound.

    Returns:
        Distinct quantized rows / distinct raw rows (1.0 for an empty chunk).
    """
    raw, quantized = homogenization_counts(chunk, eps)
    return quantized / raw if raw else 1.0


def value_homogenization_index(chunk: torch.Tensor, eps: float) -> float:
    """The per-coordinate homogenization index of one chunk at relative bound ``eps``.

    The index ``DLACCallback(index="value")`` classifies by.

    Args:
        chunk: One float32 ``[rows, dim]`` chunk.
        eps: The relative bound.

    Returns:
        Distinct quantized values / distinct raw values, per column (1.0 for an empty chunk).
    """
    raw, quantized = value_homogenization_counts(chunk, eps)
    return quantized / raw if raw else 1.0


@dataclass
class TableStats:
    """Calibration statistics of one table: sums over its chunks, per-candidate lists following ``candidates``.

    Args:
        candidates: The candidate relative bounds, ascending.
        chunks: Chunks observed.
        elements: Elements of those chunks.
        non_finite_chunks: Chunks holding a non-finite value (sent raw by the codec; they say nothing about the
            bound).
        min: Minimum over every finite chunk.
        max: Maximum over every finite chunk.
        distinct_raw: Distinct raw vectors, summed over chunks.
        distinct_quantized: Distinct quantized vectors at the index bound, summed over chunks.
        encoded_bytes: Compressed bytes at each candidate bound.
        probes: ``(batch, rank)`` loss measurements summed into ``base_loss`` / ``loss_delta`` / ``loss_delta_sq``.
        base_loss: Sum of the exact losses of the probes.
        loss_delta: Sum of signed loss changes, per candidate.
        distinct_raw_values: Distinct raw values per column, summed over columns and chunks.
        distinct_quantized_values: The same after quantization at the index bound.
        loss_delta_sq: Sum of squared loss changes, per candidate.
        grad_rows: Samples whose loss gradient was observed (one per row, per calibration batch and rank).
        grad_energy: Sum over those samples of the sum over blocks of ``range**2 x |per-sample loss gradient|**2``.
        loss_sum: Training loss of the batches whose gradients were observed, summed over batches and ranks.
        loss_batches: How many ``(batch, rank)`` losses ``loss_sum`` holds.
        loss_sq_sum: The squares of those losses, summed: their variance is the minibatch noise.
    """

    candidates: tuple[float, ...]
    chunks: int = 0
    elements: int = 0
    non_finite_chunks: int = 0
    min: float = math.inf
    max: float = -math.inf
    distinct_raw: int = 0  # distinct raw vectors, summed over chunks
    distinct_quantized: int = 0  # distinct quantized vectors at the index bound, summed over chunks
    encoded_bytes: list[int] = field(default_factory=list)
    probes: int = 0  # (batch, rank) loss measurements summed into base_loss / loss_delta / loss_delta_sq
    base_loss: float = 0.0
    loss_delta: list[float] = field(default_factory=list)  # sum of signed loss changes, per candidate
    distinct_raw_values: int = 0  # distinct raw values per column, summed over columns and chunks
    distinct_quantized_values: int = 0  # the same after quantization at the index bound
    loss_delta_sq: list[float] = field(default_factory=list)  # sum of squared loss changes, per candidate
    grad_rows: int = 0  # samples whose loss gradient was observed (one per row, per calibration batch and rank)
    grad_energy: float = 0.0  # sum over those samples of sum over blocks of range**2 x |per-sample loss gradient|**2
    loss_sum: float = 0.0  # training loss of the batches whose gradients were observed, summed over batches and ranks
    loss_batches: int = 0  # how many (batch, rank) losses loss_sum holds
    loss_sq_sum: float = 0.0  # the squares of those losses, summed: their variance is the minibatch noise

    def __post_init__(self) -> None:
        n = len(self.candidates)
        self.encoded_bytes = list(self.encoded_bytes) or [0] * n
        self.loss_delta = list(self.loss_delta) or [0.0] * n
        self.loss_delta_sq = list(self.loss_delta_sq) or [0.0] * n

    @property
    def value_range(self) -> float:
        """max - min over every observed finite chunk (0 if none)."""
        return self.max - self.min if self.max >= self.min else 0.0

    @property
    def homogenization_index(self) -> float:
        """Distinct quantized / distinct raw values per column at the index bound, over all chunks (1.0 if none).

        Statistics saved before the per-column counts existed (checkpoints of earlier versions) hold only vector
        counts: for them it is :attr:`vector_homogenization_index`.
        """
        if self.distinct_raw_values:
            return self.distinct_quantized_values / self.distinct_raw_values
        return self.vector_homogenization_index

    def index_of(self, kind: str) -> float:
        """The homogenization index of one kind.

        Args:
            kind: ``"vector"`` (:attr:`vector_homogenization_index`, the paper's) or ``"value"``
                (:attr:`homogenization_index`, per coordinate).

        Returns:
            The index.
        """
        return self.vector_homogenization_index if kind == "vector" else self.homogenization_index

    @property
    def vector_homogenization_index(self) -> float:
        """The paper's index: distinct quantized / distinct raw vectors at the index bound (1.0 if nothing seen)."""
        return self.distinct_quantized / self.distinct_raw if self.distinct_raw else 1.0

    @property
    def distinct_per_chunk(self) -> float:
        """Mean number of distinct raw vectors per chunk."""
        return self.distinct_raw / self.chunks if self.chunks else 0.0

    def ratios(self) -> dict[float, float]:
        """The compression ratio at each candidate bound.

        Returns:
            ``{bound: float32 bytes / compressed bytes}`` (1.0 where nothing was encoded).
        """
        raw = self.elements * 4
        return {eps: raw / b if b else 1.0 for eps, b in zip(self.candidates, self.encoded_bytes)}

    def sensitivity(self) -> dict[float, float] | None:
        """The probe sensitivity: root-mean-square loss change per probe at each candidate bound.

        Statistics saved before the squares were kept fall back to ``|mean change|``.

        Returns:
            ``{bound: RMS loss change / mean exact loss}``; ``None`` if unprobed.
        """
        if not self.probes or self.base_loss == 0:
            return None
        base = abs(self.base_loss) / self.probes
        if not any(self.loss_delta_sq) and any(self.loss_delta):
            return {eps: abs(d) / abs(self.base_loss) for eps, d in zip(self.candidates, self.loss_delta)}
        return {eps: math.sqrt(sq / self.probes) / base for eps, sq in zip(self.candidates, self.loss_delta_sq)}

    def gradient_sensitivity(self) -> dict[float, float] | None:
        """The gradient sensitivity: expected RMS change of a sample's loss at each candidate bound, to first order.

        The change is that of the codec's error on this table alone: ``eps x sqrt(grad_energy / grad_rows / 3) / mean
        loss`` (see the module docstring).

        Returns:
            ``{bound: RMS change / mean loss}``; ``None`` without observed gradients or losses.
        """
        if not self.grad_rows or not self.loss_batches or self.loss_sum == 0:
            return None
        rms = math.sqrt(max(self.grad_energy, 0.0) / self.grad_rows / 3.0)
        mean_loss = abs(self.loss_sum) / self.loss_batches
        return {eps: eps * rms / mean_loss for eps in self.candidates}

    def loss_noise(self) -> float | None:
        """Variance of the training loss from (batch, rank) to (batch, rank), over the measured batches.

        It is the minibatch noise the optimizer already lives with.

        Returns:
            The unbiased variance; ``None`` with fewer than two losses.
        """
        n = self.loss_batches
        if n < 2:
            return None
        mean = self.loss_sum / n
        return max(self.loss_sq_sum - n * mean * mean, 0.0) / (n - 1)

    def noise_share(self) -> dict[float, float] | None:
        """The variance the codec's error on this table adds to a batch's loss, as a share of the minibatch variance.

        The minibatch variance is :meth:`loss_noise`. The codec's error is independent per sample and element, uniform
        within ``eps x range``: to first order it changes a sample's loss by ``g . error``, of variance ``eps**2 x
        range**2 x |g|**2 / 3``, and a batch's (mean) loss by the mean of ``B`` such independent changes, of variance
        ``eps**2 x E[range**2 |g|**2] / (3 B)``, ``B`` the samples of a rank's batch. Both that and the minibatch
        variance scale with the square of the loss and, per sample, as ``1 / B``: their ratio is free of the loss's
        scale and offset and of the batch size, comparable across data sets and models (docs/adaptive.md derives it).

        Returns:
            ``{bound: added variance / minibatch variance}``; ``None`` without gradients or a measurable noise.
        """
        noise = self.loss_noise()
        if not self.grad_rows or noise is None or noise <= 0:
            return None
        per_sample = max(self.grad_energy, 0.0) / self.grad_rows / 3.0
        batch = self.grad_rows / self.loss_batches
        return {eps: eps * eps * per_sample / batch / noise for eps in self.candidates}

    def mean_loss_change(self) -> dict[float, float] | None:
        """Signed mean loss change per probe at each candidate bound, relative to the mean exact loss.

        Near zero even for a sensitive table (see the module docstring); reported for comparison.

        Returns:
            ``{bound: mean loss change / mean exact loss}``; ``None`` if unprobed.
        """
        if not self.probes or self.base_loss == 0:
            return None
        return {eps: d / abs(self.base_loss) for eps, d in zip(self.candidates, self.loss_delta)}

    def as_dict(self) -> dict:
        """The statistics as plain data, for checkpoints and reports.

        Returns:
            ``{field: value}``, lists for the per-candidate fields; :meth:`from_dict` reads it back.
        """
        return {
            "candidates": list(self.candidates),
            "chunks": self.chunks,
            "elements": self.elements,
            "non_finite_chunks": self.non_finite_chunks,
            "min": self.min,
            "max": self.max,
            "distinct_raw": self.distinct_raw,
            "distinct_quantized": self.distinct_quantized,
            "encoded_bytes": list(self.encoded_bytes),
            "probes": self.probes,
            "base_loss": self.base_loss,
            "loss_delta": list(self.loss_delta),
            "distinct_raw_values": self.distinct_raw_values,
            "distinct_quantized_values": self.distinct_quantized_values,
            "loss_delta_sq": list(self.loss_delta_sq),
            "grad_rows": self.grad_rows,
            "grad_energy": self.grad_energy,
            "loss_sum": self.loss_sum,
            "loss_batches": self.loss_batches,
            "loss_sq_sum": self.loss_sq_sum,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> TableStats:
        """Rebuild statistics from :meth:`as_dict`'s plain data.

        Args:
            d: What :meth:`as_dict` returned, also in earlier versions (which lack the per-column counts and the
                squared loss changes).

        Returns:
            The statistics.
        """
        d = dict(d)
        d["candidates"] = tuple(d["candidates"])
        return cls(**d)


# Layout of one table's sums in the all-reduce vector: fixed fields, then encoded bytes, loss deltas and squared loss
# deltas per candidate.
_SUM_FIELDS = ("chunks", "elements", "non_finite_chunks", "distinct_raw", "distinct_quantized", "probes", "base_loss",
               "distinct_raw_values", "distinct_quantized_values", "grad_rows", "grad_energy", "loss_sum",
               "loss_batches", "loss_sq_sum")
_FLOAT_FIELDS = frozenset({"base_loss", "grad_energy", "loss_sum", "loss_sq_sum"})
_PER_CANDIDATE = ("encoded_bytes", "loss_delta", "loss_delta_sq")


class CalibrationStats:
    """Accumulates :class:`TableStats` for every table while calibration runs.

    Args:
        candidates: Candidate relative bounds whose compressed size (and sensitivity) is measured, ascending.
        index_eps: Bound at which the homogenization index is measured.
        codec_impl: Codec implementation used to measure compressed sizes (``auto``, ``native``, ``ref``).

    Raises:
        ValueError: If ``candidates`` is empty or not strictly increasing, or a bound is not in (0, 1).
    """

    def __init__(self, candidates: Sequence[float], index_eps: float, codec_impl: str = "auto") -> None:
        if not candidates:
            raise ValueError("candidates must hold at least one relative bound.")
        checked = [check_relative_bound(c, "candidate bound") for c in candidates]
        if checked != sorted(set(checked)):
            raise ValueError(f"candidates={list(candidates)} must be strictly increasing.")
        self.candidates = tuple(checked)
        self.index_eps = check_relative_bound(index_eps, "index_eps")
        self.codec_impl = codec_impl
        self.tables: dict[str, TableStats] = {}

    def table(self, name: str) -> TableStats:
        """The statistics of one table, created empty on first use.

        Args:
            name: The table.

        Returns:
            Its statistics (the object this accumulates into).
        """
        if name not in self.tables:
            self.tables[name] = TableStats(self.candidates)
        return self.tables[name]

    def observe(self, name: str, chunk: torch.Tensor, index: bool = True) -> None:
        """Add one chunk of a table: its value range, homogenization counts and compressed size at each candidate.

        Args:
            name: The table.
            chunk: Its ``[rows, dim]`` pooled embeddings bound for one rank.
            index: Count the homogenization indices; ``False`` skips them (nine tenths of the cost; the modes that
                only report them measure them on fewer chunks): the indices are ratios of counts summed over the
                chunks that were counted.
        """
        s = self.table(name)
        chunk = chunk.detach().float().cpu().contiguous()
        s.chunks += 1
        s.elements += chunk.numel()
        if chunk.numel() == 0:
            return
        if not bool(torch.isfinite(chunk).all()):
            s.non_finite_chunks += 1  # sent raw by the codec; says nothing about the bound
            for i in range(len(self.candidates)):
                s.encoded_bytes[i] += chunk.numel() * 4
            return
        s.min = min(s.min, float(chunk.min()))
        s.max = max(s.max, float(chunk.max()))
        if index:
            raw, quantized = homogenization_counts(chunk, self.index_eps)
            s.distinct_raw += raw
            s.distinct_quantized += quantized
            raw, quantized = value_homogenization_counts(chunk, self.index_eps)
            s.distinct_raw_values += raw
            s.distinct_quantized_values += quantized
        for i, eps in enumerate(self.candidates):
            s.encoded_bytes[i] += int(encode(chunk, eps=eps, impl=self.codec_impl).numel())

    def observe_gradient(self, name: str, energy: float, rows: int) -> None:
        """Add one call's loss gradient of a table (what the exchange's gradient observer reports).

        Args:
            name: The table.
            energy: The sum over its column blocks of the chunk's squared value range times the block's summed
                squared gradient entries.
            rows: The samples of the batch.
        """
        s = self.table(name)
        # The exchange's gradient is that of the batch loss, a mean over the rows: a sample's own loss gradient is
        # rows times its row, so the sum of the samples' squared norms is rows**2 times the summed squares.
        s.grad_energy += float(energy) * rows * rows
        s.grad_rows += int(rows)

    def record_batch_loss(self, loss: float, tables: Sequence[str]) -> None:
        """Add the training loss of a batch whose gradients were observed, to every table of ``tables``.

        It is the mean loss the gradient sensitivity is relative to, and the minibatch noise the noise share is.

        Args:
            loss: The batch's training loss.
            tables: The tables whose gradients the batch showed.
        """
        for name in tables:
            s = self.table(name)
            s.loss_sum += float(loss)
            s.loss_sq_sum += float(loss) ** 2
            s.loss_batches += 1

    def record_loss(self, name: str, base_loss: float, probed_losses: Sequence[float]) -> None:
        """Add one probe measurement of a table: the exact loss and the loss at each candidate bound.

        Args:
            name: The table.
            base_loss: The loss with every table exact.
            probed_losses: The loss with this table at each candidate bound, in ``candidates`` order.

        Raises:
            ValueError: If there is not one probed loss per candidate.
        """
        if len(probed_losses) != len(self.candidates):
            raise ValueError(f"need one probed loss per candidate ({len(self.candidates)}), got {len(probed_losses)}.")
        s = self.table(name)
        s.probes += 1
        s.base_loss += float(base_loss)
        for i, loss in enumerate(probed_losses):
            delta = float(loss) - float(base_loss)
            s.loss_delta[i] += delta
            s.loss_delta_sq[i] += delta * delta

    # ------------------------------------------------------------------ cross-rank reduction

    def to_tensors(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The statistics of some tables as three float64 tensors to all-reduce with SUM, MIN and MAX.

        Args:
            names: The tables, in that order; every rank must pass the same ``names``.

        Returns:
            ``{"sum": ..., "min": ..., "max": ...}``, one row per table; :meth:`load_tensors` reads them back.
        """
        n = len(self.candidates)
        width = len(_SUM_FIELDS) + len(_PER_CANDIDATE) * n
        sums = torch.zeros(len(names), width, dtype=torch.float64)
        mins = torch.full((len(names),), math.inf, dtype=torch.float64)
        maxs = torch.full((len(names),), -math.inf, dtype=torch.float64)
        for i, name in enumerate(names):
            s = self.tables.get(name)
            if s is None:
                continue
            row = [getattr(s, f) for f in _SUM_FIELDS] + [v for f in _PER_CANDIDATE for v in getattr(s, f)]
            sums[i] = torch.tensor(row, dtype=torch.float64)
            mins[i], maxs[i] = s.min, s.max
        return {"sum": sums, "min": mins, "max": maxs}

    def load_tensors(self, names: Sequence[str], tensors: Mapping[str, torch.Tensor]) -> None:
        """Replace the statistics of some tables by the (reduced) tensors of :meth:`to_tensors`.

        Args:
            names: The tables, as given to :meth:`to_tensors`.
            tensors: The tensors it returned, reduced across ranks.
        """
        n = len(self.candidates)
        k = len(_SUM_FIELDS)
        sums, mins, maxs = (tensors[key].detach().cpu().double() for key in ("sum", "min", "max"))
        for i, name in enumerate(names):
            row = sums[i].tolist()
            s = TableStats(self.candidates)
            for j, f in enumerate(_SUM_FIELDS):
                setattr(s, f, row[j] if f in _FLOAT_FIELDS else int(round(row[j])))
            s.encoded_bytes = [int(round(v)) for v in row[k : k + n]]
            s.loss_delta = row[k + n : k + 2 * n]
            s.loss_delta_sq = row[k + 2 * n : k + 3 * n]
            s.min, s.max = float(mins[i]), float(maxs[i])
            self.tables[name] = s
