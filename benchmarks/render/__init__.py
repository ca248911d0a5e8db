"""The renderer: every figure block of README.md and docs/, made from the results files (``python -m
benchmarks.render``). One module per document section (:mod:`benchmarks.render.blocks` lists them); the shared
pieces (the results directory, the block record, the source line) are :mod:`benchmarks.render.core`'s."""
