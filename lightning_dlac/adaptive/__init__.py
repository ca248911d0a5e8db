"""Error-bound policy: table-wise calibration and iteration-wise decay (plain functions, no Lightning)."""
