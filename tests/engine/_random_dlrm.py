"""A DLRM whose training step draws at random from every generator a restart must carry on (tests of exact
restarts: tests/engine/test_checkpoint.py, and the elastic tests' config names it).

:class:`RandomDLRM` is the example DLRM with a training step that applies dropout to the logits (torch's
generator), adds a loss on sampled negatives (rows drawn with ``torch.randint`` and scored as clicks that did not
happen, as a model with sampled negatives would), and takes the dropout rate from NumPy's global generator and the
negatives' weight from Python's :mod:`random`. A restart that lost any of the four states (torch CPU, NumPy,
Python; CUDA where there is one) would train on different numbers from the first resumed step on.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning_dlac.examples.dlrm import DLRMModule
from torch.nn import functional as F  # noqa: N812 - torch's own spelling


class RandomDLRM(DLRMModule):
    """:class:`~lightning_dlac.examples.dlrm.DLRMModule` with dropout and sampled negatives in its training step."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        logits = F.dropout(self(batch), p=float(np.random.uniform(0.05, 0.2)), training=True)
        labels = batch.labels.float()
        negatives = torch.randint(0, logits.numel(), (max(1, logits.numel() // 8),), device=logits.device)
        weight = 0.05 + 0.1 * random.random()
        loss = self.loss_fn(logits, labels) + weight * self.loss_fn(logits[negatives], torch.zeros_like(
            logits[negatives]))  # fmt: skip
        self.log("train/loss", loss, prog_bar=True, batch_size=labels.numel())
        return loss
