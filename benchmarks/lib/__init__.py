"""The benchmarks' library: what the scripts and the renderer share. It imports no script and not the renderer.

Shared helpers:

- ``paths``: the repository, the results and payloads folders, the team's Criteo sample;
- ``results``: a results file: its metadata (commit, date, machine, command, versions, wall time), writing, reading;
- ``launch``: running a function on N gloo ranks; the error line of a failed launch;
- ``rule``: the rule every "met" follows, and the phrases that report a judged target;
- ``plan``: which script writes which results file at each depth of the suite; each script's ``--help`` epilog.

One module per family of results, for what its script and the renderer both need:

- ``codec``, ``payloads``: the CPU codec benchmark's targets and tables; its payloads (Zipf, Criteo DLRM, DLRM v2);
- ``cuda_codec``, ``gpu_payloads``: the GPU codec benchmark's batches and table; the shipped payloads it reads;
- ``e2e``, ``pipeline``, ``qcomm``: the end-to-end step (variants, one rank, pooling, ratios, targets); the pipelined
  step and its phase timers; TorchRec's codecs with their bytes counted;
- ``estimate_check``: ``dlac estimate`` against the two-node launches; ``scaling``: the step model's tables;
- ``accuracy``, ``frontier``: the accuracy benchmark's variants, traffic meter and tables; the accuracy-bytes frontier;
- ``calibration_data``, ``calibration_arms``, ``calibration_judgement``, ``calibration_resume``: the calibration
  benchmarks' data sets (the fair set, the family of worlds), their arms, their judgement and their resumes;
- ``checkpoint``, ``data``: the checkpoint and data-path benchmarks' tables.
"""
