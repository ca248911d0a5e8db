"""The benchmarks behind every figure of README.md and docs/: scripts that measure and write results files, the
library they share, and the renderer that puts the results into the documents. Run from the repository root:

    python -m benchmarks.<script> --help      # what it measures, what results file it writes, how long its run took
    python -m benchmarks.suite --depth quick   # every figure a release is judged on (make bench-quick)
    python -m benchmarks.render                # the figure blocks of README.md and docs/ from benchmarks/results/

Three rooms, each importing only what is below it (tests/benchmarks/test_layout.py holds the code to it):

- the scripts, in this folder: one per family of results files, each measuring and writing ``results/<name>.json``;
  they import the library and lightning_dlac, never another script (nothing imports a script);
- ``lib/``: what the scripts and the renderer share (paths, results metadata, launching, the rule, the plan of every
  depth, and per family its constants, runs and tables); it never imports the renderer;
- ``render/``: ``python -m benchmarks.render``, one module per document section it renders.

The scripts, by the results they write (``lib/plan.py`` has every file's command at each depth):

- ``codec_bench``: the CPU codec against FP16, INT8, SZ3, ZFP and entropy bounds (``codec_bench*.json``);
- ``cuda_codec_bench``, ``cuda_profile``: the CUDA kernels on a lent GPU (``gpu_session.sh``, ``cuda_profile.sh``);
- ``capture_payloads``: the GPU benchmark's realistic payloads (``payloads/criteo_dlrm.npz``);
- ``e2e_bandwidth``: training steps under a throttled loopback against TorchRec's codecs (``e2e_*.json``);
- ``e2e_topology``: training steps on two emulated nodes, and ``dlac estimate`` against them;
- ``exchange_profile``: the compressed exchange phase by phase;
- ``scaling_model``: ``dlac estimate``'s step model validated here and projected to GPU clusters;
- ``adaptive_accuracy``: accuracy and traffic of the adaptive policy and TorchRec's codecs (``adaptive_*.json``);
- ``calibration_bench``: the table-wise level on a fair set and on the family of worlds (``calibration_*.json``);
- ``frontier_worlds``: the accuracy-bytes frontier on the family of worlds;
- ``checkpoint_bench``, ``data_bench``: checkpoint save, load and restart; the Criteo data path at full size;
- ``suite``: every step of one depth of the plan (``suite_<depth>.json``).

Importing the package imports nothing: the lent GPU machine runs the GPU scripts with torch alone.
"""
