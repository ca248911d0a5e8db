"""Pipelined training: TorchRec's sparse-dist pipeline, driven by a training loop that owns its own step
(``DLACStrategy(pipeline="sparse_dist")``).

TorchRec's ``TrainPipelineSparseDist`` starts the *input distribution* of the next batch (the all-to-all that sends
every id to the rank that owns its table) while the current batch trains, so that exchange leaves the critical path.
Its ``progress()`` runs the forward, the backward and the optimizer step itself. Under Lightning the loop owns those
(closures, precision, gradient clipping and accumulation, manual optimization, every hook), so
:class:`SparseDistPipeline` keeps TorchRec's pipeline (its model rewrite, contexts, input-dist stages and streams)
and hands the step back to the loop: the loop calls :meth:`SparseDistPipeline.step` around each training step's
forward, and the pipeline does the rest one batch ahead of it.

| the loop | the pipeline |
|---|---|
| its loader yields batch ``i`` | has read batch ``i + 1`` already (:class:`LookaheadLoader`) |
| moves batch ``i`` to the device | hands over its copy of batch ``i``, moved once (:meth:`~.to_device`) |
| step ``i``, before the forward | batch ``i``'s ids are on their way (the first batch of a pass: sent now); moves |
| | batch ``i + 1``, starts its input dist (the splits all-to-all) |
| the forward | the sharded embedding modules take batch ``i``'s ids from the pipeline (``PipelinedForward``) |
| after the forward | waits for batch ``i + 1``'s splits, launches the all-to-all of its ids (during the backward) |

Order changes, semantics do not: batch ``i + 1``'s ids are the same whenever they travel, and its embeddings are
still looked up in its own forward, after batch ``i``'s fused optimizer update. A pipelined run trains exactly as an
unpipelined one, loss for loss (tests/engine/test_pipeline.py). Every other forward (validation, ``DLACCallback``'s
probes
and calibration, a second ``training_step`` call for the same batch, as LBFGS's closure makes) runs the sharded
modules' own forward, unpipelined.

What the pipeline needs, and where each is checked:

- TorchRec traces the model's ``forward`` with ``torch.fx`` (sharded modules and DDP are leaves) to find which
  attribute of the batch each sharded module reads; ``forward`` must be symbolically traceable, and at least one
  sharded module must take its input from the batch unchanged (:class:`SparseDistPipeline`'s constructor).
- In the training step the sharded modules must receive what ``forward`` reads from the batch (checked at every
  pipelined forward: the ids were sent ahead, so anything else would be trained on the wrong ids).
- Batches must be ``Pipelineable`` (``torchrec.datasets.utils.Batch`` is): they are moved and streamed as TorchRec's.

The two differences a user can see: a pipelined loader reads one batch ahead (a stateful loader's saved position
is still that of the last batch the loop received), and a step holds two batches (the next one's ids in flight).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.train_pipeline.pipeline_context import TrainPipelineContext
from torchrec.distributed.train_pipeline.runtime_forwards import PipelinedForward
from torchrec.distributed.train_pipeline.tracing import GetAttrArgInfoStep, GetItemArgInfoStep, NoopArgInfoStep
from torchrec.distributed.train_pipeline.utils import _rewrite_model, _wait_for_batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

if TYPE_CHECKING:
    from torchrec.distributed.model_parallel import DistributedModelParallel

log = logging.getLogger(__name__)


class Pipeline(str, Enum):
    """The train pipelines ``DLACStrategy(pipeline=...)`` offers."""

    SPARSE_DIST = "sparse_dist"  # TorchRec's TrainPipelineSparseDist: the next batch's ids travel during this step

    def __str__(self) -> str:
        return self.value


class PipelineError(RuntimeError):
    """The model or the run cannot train through the pipeline; the message says why and what to do instead."""


@dataclass(eq=False)
class _Entry:
    """One batch the pipeline's loader read, from the read to its training step."""

    raw: Any  # as the loader yielded it
    batch: Any = None  # moved to the device (what the loop trains on)
    context: TrainPipelineContext | None = None  # its input dist, once started


class _StepForward(PipelinedForward):
    """TorchRec's ``PipelinedForward`` (the module takes its input from the pipeline's context) inside a pipelined
    training step's forward; the sharded module's own forward in any other forward. Bound to its pipeline after
    TorchRec's model rewrite has built it (:meth:`SparseDistPipeline._rewrite`)."""

    pipeline: SparseDistPipeline | None = None
    own_forward: Callable[..., Any] | None = None

    def __call__(self, *input: Any, **kwargs: Any) -> Any:
        pipeline = self.pipeline
        if pipeline is None or not pipeline.in_forward:
            return self.own_forward(*input, **kwargs)
        pipeline._check_input(self, input, kwargs)
        return super().__call__(*input, **kwargs)


def _describe(call_args: Any) -> str:
    """Where a sharded module's input comes from, as code: ``batch.sparse_features``, ``batch["ids"]``..."""
    parts = []
    for arg in [*call_args.args, *call_args.kwargs.values()]:
        text = "batch"
        for step in arg.steps:
            if isinstance(step, GetAttrArgInfoStep):
                text += f".{step.attr_name}"
            elif isinstance(step, GetItemArgInfoStep):
                text += f"[{step.item_index!r}]"
            elif not isinstance(step, NoopArgInfoStep):
                text += f" ({type(step).__name__})"
        parts.append(text)
    return ", ".join(parts)


def _same_input(given: Any, sent: Any) -> bool:
    """Whether the input a module was called with is the one whose ids were sent ahead: the same object, or a
    KeyedJaggedTensor over the same storage (a container a wrapper rebuilt around the same tensors)."""
    if given is sent:
        return True
    if isinstance(given, KeyedJaggedTensor) and isinstance(sent, KeyedJaggedTensor):
        return (given.keys() == sent.keys() and given.values().data_ptr() == sent.values().data_ptr()
                and given.values().shape == sent.values().shape
                and given.lengths().data_ptr() == sent.lengths().data_ptr())
    return False


class SparseDistPipeline(TrainPipelineSparseDist):
    """TorchRec's ``TrainPipelineSparseDist`` for a loop that runs the step itself (module docstring).

    The loop (``DLACStrategy``, or a plain loop) reads its batches through :meth:`loader`, moves each with
    :meth:`to_device` and runs each training step's forward inside :meth:`step`; backward and optimizer step stay
    the loop's. ``progress()``, TorchRec's own step, is not used.

    Args:
        model: The sharded model (``DistributedModelParallel``); its forward is traced now.
        device: This rank's device.
        move: Moves a batch as the loader yields it to ``device`` (under Lightning: the strategy's
            ``batch_to_device``, with the LightningModule's transfer hooks).

    Raises:
        PipelineError: ``forward`` cannot be traced, or no sharded module takes its input from the batch unchanged.
    """

    _pipelined_forward_type = _StepForward

    def __init__(self, model: DistributedModelParallel, device: torch.device,
                 move: Callable[[Any], Any] | None = None) -> None:
        # Lightning (or the plain loop) steps the optimizers: the pipeline never calls the one TorchRec asks for.
        super().__init__(model, optimizer=None, device=device, execute_all_batches=True)  # type: ignore[arg-type]
        self._move = move if move is not None else (lambda batch: batch.to(device, non_blocking=True))
        # The loop moves batches on the current stream, so the input dist waits for that stream, not a copy stream.
        self._memcpy_stream = None
        self._entries: deque[_Entry] = deque()  # read, not yet trained, oldest first
        self._current: _Entry | None = None  # the batch of the step in progress (or the last one)
        self._in_forward = False
        self._sent_ahead = 0  # steps whose ids were sent during the step before
        self._sent_in_step = 0  # steps that had to send their own (the first batch of a pass)
        self._rewrite()

    # ------------------------------------------------------------------ read-outs

    @property
    def in_forward(self) -> bool:
        """Whether a pipelined training step's forward is running (the sharded modules take the sent ids)."""
        return self._in_forward

    @property
    def pipelined_modules(self) -> list[str]:
        """The sharded modules whose input dist runs ahead (their names in the model)."""
        return [m.forward.name for m in self._pipelined_modules]

    @property
    def pending(self) -> int:
        """Batches read and not yet trained."""
        return len(self._entries)

    @property
    def sent_ahead(self) -> int:
        """Training steps so far whose ids were sent during the step before (counts only grow)."""
        return self._sent_ahead

    @property
    def sent_in_step(self) -> int:
        """Training steps so far that sent their own ids (the first batch of each pass through the loader)."""
        return self._sent_in_step

    # ------------------------------------------------------------------ the model rewrite

    def _rewrite(self) -> None:
        """TorchRec's model rewrite: trace ``forward``, give every sharded module whose input is read off the batch a
        pipelined forward; unlike TorchRec, keep each module's input dist its own (no fused splits), so the
        modules' own forwards keep working for every unpipelined forward."""
        module = getattr(self._model, "module", self._model)
        name = type(module).__name__
        device = torch.get_device_module(self._device)
        try:
            rewritten = _rewrite_model(model=self._model, context=self._create_context(),
                                       dist_stream=self._data_dist_stream, default_stream=device.current_stream(),
                                       batch=None, apply_jit=False, pipelined_forward=_StepForward)
        except Exception as err:  # noqa: BLE001 - torch.fx raises whatever the traced code raises on a Proxy
            raise PipelineError(
                f"pipeline='sparse_dist' could not trace {name}.forward with torch.fx ({type(err).__name__}: {err})."
                " TorchRec's pipeline traces forward(batch) to learn which part of the batch each sharded embedding"
                " module reads, so that it can send those ids one step ahead; forward must be symbolically"
                " traceable: no Python branching or loops on tensor values or on the batch's contents, no"
                " conversion of traced values to Python numbers. Move such code out of forward (into"
                " training_step, after the embedding modules ran), or train without the pipeline (pipeline=None)."
            ) from err
        self._pipelined_modules, self._model, self._original_forwards, self._pipelined_postprocs, skipped = rewritten
        for sharded, own in zip(self._pipelined_modules, self._original_forwards):
            sharded.forward.pipeline = self
            sharded.forward.own_forward = own
        if not self._pipelined_modules:
            raise PipelineError(
                f"pipeline='sparse_dist' found no sharded embedding module in {name}.forward that takes its input"
                f" straight from the batch{' (' + ', '.join(skipped) + ')' if skipped else ''}: forward builds or"
                " changes the KeyedJaggedTensor before the embedding module sees it, so its ids cannot be sent"
                " before the step. Pass an attribute (or item) of the batch to the embedding module unchanged, e.g."
                " self.ebc(batch.sparse_features), and do any other transformation in the data pipeline; or train"
                " without the pipeline (pipeline=None)."
            )
        if skipped:
            log.warning(f"pipeline='sparse_dist': the sharded modules {skipped} of {name} change their input in"
                        " forward, so their ids are sent in the step itself (unpipelined), as without the pipeline.")
        for sharded in self._pipelined_modules:
            log.info(f"pipeline='sparse_dist': {sharded.forward.name} reads {_describe(sharded.forward.args)} of the"
                     " batch, sent one step ahead.")

    def restore(self) -> None:
        """Give the sharded modules their own forwards back (after training); the pipeline is unusable after this.

        Runs no collective (a run that failed may be here with its ranks out of step): :meth:`drain` first, where
        every rank reaches the same point.
        """
        self._entries.clear()
        self._current = None
        for sharded, own in zip(self._pipelined_modules, self._original_forwards):
            sharded.forward = own
            sharded.is_pipelined = False
        self._pipelined_modules, self._original_forwards = [], []

    # ------------------------------------------------------------------ batches

    def loader(self, loader: Any) -> LookaheadLoader:
        """Wrap the training loader so that it is read one batch ahead, every batch registered with this pipeline.

        Args:
            loader: The training loader.

        Returns:
            The loader read one batch ahead (Lightning's stateful-dataloader protocol kept).
        """
        return lookahead_loader(loader, self._read)

    def _read(self, raw: Any) -> None:
        self._entries.append(_Entry(raw))

    def to_device(self, batch: Any) -> Any | None:
        """The pipeline's device copy of a batch its loader yielded, moved now if it was not moved yet.

        Args:
            batch: The batch as the loader yielded it.

        Returns:
            Its device copy; ``None`` for a batch the pipeline did not read (validation, calibration...).
        """
        entry = next((e for e in self._entries if e.raw is batch), None)
        if entry is None:
            return None
        if entry.batch is None:
            entry.batch = self._move(entry.raw)
        return entry.batch

    # ------------------------------------------------------------------ the step

    @contextlib.contextmanager
    def step(self, batch: Any, last: bool = False) -> Iterator[None]:
        """The forward of one training step of ``batch`` (as :meth:`to_device` returned it) runs inside this block.

        Before it: ``batch``'s ids are on their way (sent now for the first batch of a pass), the next batch is moved
        and its input dist started (unless ``last``: the loop will not train another batch of this pass). After it:
        the next batch's ids are launched, to travel during the backward. A second block for the same batch (a
        closure evaluated again) runs unpipelined.

        Args:
            batch: The batch, as :meth:`to_device` returned it.
            last: The loop will not train another batch of this pass: nothing is sent ahead.

        Yields:
            Nothing; the step's forward runs inside the block.

        Raises:
            PipelineError: ``batch`` is not a batch the pipeline's loader read.
        """
        entry = self._take(batch)
        if entry is None:
            yield
            return
        if entry.context is None:  # the first batch of a pass: nothing sent it ahead
            self._start(entry)
            self.wait_sparse_data_dist(entry.context)
            self._sent_in_step += 1
        else:
            self._sent_ahead += 1
        self._set_module_context(entry.context)
        _wait_for_batch(entry.batch, self._data_dist_stream)
        upcoming = self._entries[0] if self._entries and not last else None
        if upcoming is not None:
            self.to_device(upcoming.raw)
            self._start(upcoming)
        self._in_forward = True
        try:
            yield
        finally:
            self._in_forward = False
        if upcoming is not None:
            self.wait_sparse_data_dist(upcoming.context)

    def _take(self, batch: Any) -> _Entry | None:
        """The entry of ``batch``, removed from the queue with any older one (read but not trained: a pass cut
        short); ``None`` for the batch of the step in progress (its forward again)."""
        if self._current is not None and batch is self._current.batch:
            return None
        index = next((i for i, e in enumerate(self._entries) if e.batch is batch), None)
        if index is None:
            raise PipelineError(
                "pipeline='sparse_dist': training_step received a batch that the pipeline's loader did not hand"
                " over. The pipeline sends each batch's ids one step ahead, so the batch must reach training_step as"
                " the training dataloader yields it, moved to the device: a hook or plugin that replaces it in"
                " between (on_before_batch_transfer, a precision plugin that converts inputs) is not supported."
                " Do that work in the dataloader, or train without the pipeline (pipeline=None)."
            )
        for _ in range(index):
            self._finish(self._entries.popleft())
        self._current = self._entries.popleft()
        return self._current

    def _start(self, entry: _Entry) -> None:
        """Start ``entry``'s input dist (the splits all-to-all), after the stream that moved its batch."""
        entry.context = self._create_context()
        if self._data_dist_stream is not None:
            self._data_dist_stream.wait_stream(torch.get_device_module(self._device).current_stream())
            entry.batch.record_stream(self._data_dist_stream)
        self.start_sparse_data_dist(entry.batch, entry.context)

    def _finish(self, entry: _Entry) -> None:
        """Wait for whatever of ``entry``'s input dist is in flight (a batch read and never trained)."""
        context = entry.context
        if context is None:
            return
        if context.fused_splits_awaitables:
            self.wait_sparse_data_dist(context)
        for request in context.input_dist_tensors_requests.values():
            request.wait()
        context.input_dist_tensors_requests.clear()

    def drain(self) -> None:
        """Wait for every input dist in flight and forget the batches read ahead (the end of training).

        Every rank must call it at the same point, as any collective.
        """
        while self._entries:
            self._finish(self._entries.popleft())
        self._current = None

    def _check_input(self, forward: _StepForward, given_args: tuple, given_kwargs: dict) -> None:
        """Refuse a pipelined forward whose module was called with anything but what forward() reads from the batch:
        its ids were sent ahead from there, so the step would otherwise train on other ids than it was given."""
        sent_args, sent_kwargs = forward.args.build_args_kwargs(self._current.batch)
        same = len(given_args) == len(sent_args) and all(map(_same_input, given_args, sent_args)) and \
            given_kwargs.keys() == sent_kwargs.keys() and all(_same_input(given_kwargs[k], v)
                                                              for k, v in sent_kwargs.items())
        if not same:
            raise PipelineError(
                f"pipeline='sparse_dist': {forward.name} was called in training_step with another input than"
                f" {_describe(forward.args)}, which forward(batch) passes it and whose ids the pipeline sent one step"
                " ahead. Have training_step run the model on the batch as forward does (e.g. self(batch)), or train"
                " without the pipeline (pipeline=None)."
            )


class LookaheadLoader:
    """A loader read one batch ahead: when the loop receives batch ``i``, batch ``i + 1`` has been read (and handed
    to ``on_read``), so the pipeline can send its ids during step ``i``.

    Make one with :func:`lookahead_loader`, which keeps Lightning's stateful-dataloader protocol.

    Args:
        loader: The training loader.
        on_read: Called with every batch as it is read, in order.
    """

    def __init__(self, loader: Any, on_read: Callable[[Any], None]) -> None:
        self.loader = loader
        self._on_read = on_read
        self._state: Any = None  # the wrapped loader's state after the batch last handed out (stateful loaders)

    def __len__(self) -> int:
        return len(self.loader)  # TypeError for an unsized loader, as Lightning expects

    def __iter__(self) -> Iterator[Any]:
        self._state = None
        return self._batches(iter(self.loader))

    def _batches(self, source: Iterator[Any]) -> Iterator[Any]:
        pending = self._read_one(source)
        while pending is not None:
            upcoming = self._read_one(source)
            batch, self._state = pending
            yield batch
            pending = upcoming

    def _read_one(self, source: Iterator[Any]) -> tuple[Any, Any] | None:
        try:
            batch = next(source)
        except StopIteration:
            return None
        self._on_read(batch)
        return batch, self._loader_state()

    def _loader_state(self) -> Any:
        return None


def lookahead_loader(loader: Any, on_read: Callable[[Any], None]) -> LookaheadLoader:
    """``loader`` read one batch ahead (:class:`LookaheadLoader`). When ``loader`` is stateful (Lightning's
    stateful-dataloader protocol: ``state_dict`` / ``load_state_dict``, as the examples' resumable loaders), so is the
    result, and its state is ``loader``'s as it was right after the batch the loop received last, not after the one
    read ahead: a run resumed mid-epoch starts where the loop stopped."""
    stateful = callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
    return (_StatefulLookaheadLoader if stateful else LookaheadLoader)(loader, on_read)


class _StatefulLookaheadLoader(LookaheadLoader):
    """:class:`LookaheadLoader` of a stateful loader: saves and restores the wrapped loader's position."""

    def _loader_state(self) -> Any:
        return self.loader.state_dict()

    def state_dict(self) -> Any:
        """The wrapped loader's state right after the batch the loop received last."""
        return self._state if self._state is not None else self.loader.state_dict()

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore the wrapped loader's state (its next pass starts there)."""
        self._state = None
        self.loader.load_state_dict(state_dict)


__all__ = ["LookaheadLoader", "Pipeline", "PipelineError", "SparseDistPipeline", "lookahead_loader"]
