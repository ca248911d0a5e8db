"""lightning-dlac: error-bounded, dual-level adaptive compression of TorchRec's embedding all-to-all for Lightning.

Importing the package registers ``Trainer(strategy="dlac")``.
"""

from lightning_dlac.callback import DLACCallback
from lightning_dlac.strategy import DLACStrategy, EmbeddingOptimizer, dense_parameters

__version__ = "0.1.0"
__all__ = ["DLACCallback", "DLACStrategy", "EmbeddingOptimizer", "dense_parameters"]
