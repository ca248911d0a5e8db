"""Compressed all-to-all for TorchRec's sharded pooled-embedding communication."""
