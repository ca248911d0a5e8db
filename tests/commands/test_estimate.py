"""The step-time model behind ``dlac estimate`` (lightning_dlac.commands.estimate): its formulas on numbers worked by
hand,
its input checks, and the subcommand."""

from __future__ import annotations

import logging

import pytest

from lightning_dlac.commands.estimate import (
    METHODS,
    Codec,
    Link,
    Workload,
    _dims,
    combine_ratios,
    main,
    predict,
    predict_all,
    table,
)

# 2 tables of dim 8, batch 1000 per rank: a rank sends (W - 1) / W * 1000 * 16 * 4 bytes per direction.
WORKLOAD = Workload(batch_per_rank=1000, embedding_dims=(8, 8), compute_ms=10.0, dense_params=1000)
CODEC = Codec(forward_ratio=20.0, backward_ratio=5.0, encode_gb_s=1.0, decode_gb_s=2.0, backward_encode_gb_s=0.5,
              cast_gb_s=4.0)


def test_fp32_on_a_per_gpu_link_is_latency_plus_bytes_over_bandwidth() -> None:
    link = Link(gbit_s=1.0, latency_us=100.0)
    p = predict("fp32", WORKLOAD, CODEC, link, world=4)
    raw = 3 / 4 * 1000 * 16 * 4  # 48,000 bytes
    wire_ms = 3 * 0.1 + 8 * raw / 1e9 * 1e3  # 3 messages of 100 us + 0.384 ms
    assert p.forward_ms == pytest.approx(wire_ms) and p.backward_ms == pytest.approx(wire_ms)
    ring = 2 * 3 / 4 * 1000 * 4
    assert p.allreduce_ms == pytest.approx(6 * 0.1 + 8 * ring / 1e9 * 1e3)
    assert p.step_ms == pytest.approx(10.0 + 2 * wire_ms + p.allreduce_ms)
    # A shared link carries every rank's bytes: W times the bandwidth term, the same latency.
    shared = predict("fp32", WORKLOAD, CODEC, Link(1.0, 100.0, "shared"), world=4)
    assert shared.forward_ms == pytest.approx(3 * 0.1 + 4 * 8 * raw / 1e9 * 1e3)


def test_dlac_pays_its_codec_and_a_size_exchange_and_sends_raw_over_ratio() -> None:
    link = Link(gbit_s=1.0, latency_us=100.0)
    p = predict("dlac_dlac", WORKLOAD, CODEC, link, world=2)
    raw = 1 / 2 * 1000 * 16 * 4  # 32,000 bytes
    assert p.parts["forward_codec_ms"] == pytest.approx((raw / 1e9 + raw / 2e9) * 1e3)
    assert p.parts["forward_wire_ms"] == pytest.approx(2 * 0.1 + 8 * raw / 20 / 1e9 * 1e3)
    # Gradients: their own encode rate, the forward's decode rate (not given), their own ratio.
    assert p.parts["backward_codec_ms"] == pytest.approx((raw / 0.5e9 + raw / 2e9) * 1e3)
    assert p.parts["backward_wire_ms"] == pytest.approx(2 * 0.1 + 8 * raw / 5 / 1e9 * 1e3)
    # BF16 backward: TorchRec's cast of the whole buffer (own rows included), encode and decode, half the bytes.
    bf16 = predict("dlac_bf16", WORKLOAD, CODEC, link, world=2)
    assert bf16.parts["backward_codec_ms"] == pytest.approx(2 * 1000 * 16 * 4 / 4e9 * 1e3)
    assert bf16.parts["backward_wire_ms"] == pytest.approx(0.1 + 8 * raw / 2 / 1e9 * 1e3)


def test_int8_ratio_is_torchrec_row_wise_layout() -> None:
    # One byte per element plus a float32 scale and bias per row of each table: 64 / (64 + 8) * 4 = 3.56 at dim 64.
    assert Workload(4096, (64,) * 26, 1.0).int8_ratio == pytest.approx(4 * 64 / 72)
    p = predict("int8_fp16", WORKLOAD, CODEC, Link(1.0, 0.0), world=2)
    assert p.parts["forward_wire_ms"] == pytest.approx(8 * 32_000 / (4 * 16 / 32) / 1e9 * 1e3)


def test_compression_pays_more_the_slower_the_link() -> None:
    speedups = []
    for gbit in (1.0, 10.0, 100.0, 1000.0):
        preds = predict_all(WORKLOAD, CODEC, Link(gbit, 10.0), world=8)
        speedups.append(preds["fp32"].step_ms / preds["dlac_dlac"].step_ms)
    assert speedups == sorted(speedups, reverse=True) and speedups[0] > 1 > speedups[-1], speedups


def test_combine_ratios_weights_tables_by_their_raw_bytes() -> None:
    # 100 bytes at 10x and 300 bytes at 3x: 10 + 100 bytes sent for 400 raw.
    assert combine_ratios({"a": 100, "b": 300}, {"a": 10.0, "b": 3.0}) == pytest.approx(400 / 110)
    with pytest.raises(ValueError, match=r"no ratio for table\(s\) \['b'\]"):
        combine_ratios({"a": 1, "b": 1}, {"a": 2.0})


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Link(0.0), "gbit_s=0.0 must be a finite number > 0"),
        (lambda: Link(1.0, kind="ring"), "link kind 'ring' is not supported; choose one of"),
        (lambda: Workload(0, (8,), 1.0), "batch_per_rank=0 must be >= 1"),
        (lambda: Workload(8, (), 1.0), "needs one dimension >= 1 per table"),
        (lambda: Workload(8, (8,), 1.0, allreduce_hidden=2.0), "allreduce_hidden=2.0 must be between 0 and 1"),
        (lambda: Codec(0.5, 1.0, 1.0, -1.0), "decode_gb_s=-1.0 must be a finite number > 0"),
        (lambda: predict("zstd", WORKLOAD, CODEC, Link(1.0), 2), "method 'zstd' is not modelled"),
        (lambda: predict("fp32", WORKLOAD, CODEC, Link(1.0), 1), "world=1 must be >= 2"),
        (lambda: _dims("26x"), "write COUNTxDIM or DIM"),
    ],
)
def test_bad_inputs_are_named(build, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=message):
        build()


def test_dims_and_table() -> None:
    assert _dims("2x64,128") == (64, 64, 128) and _dims("16") == (16,)
    lines = table({8: predict_all(WORKLOAD, CODEC, Link(10.0), 8)})
    assert len(lines) == 3 and lines[2].startswith("| 8 | ") and lines[2].count("x)") == len(METHODS)
    assert "(1.00x)" in lines[2]  # FP32 against itself


def test_dlac_estimate_subcommand_logs_a_table(caplog: pytest.LogCaptureFixture) -> None:
    from lightning_dlac.commands.cli import main as cli_main

    with caplog.at_level(logging.INFO):
        cli_main(["estimate", "--world-sizes", "8,64", "--gbit", "100", "--compute-ms", "5", "--encode-gbps", "100",
                  "--decode-gbps", "100", "--cast-gbps", "500"])
    text = caplog.text
    assert "100 Gbit/s per GPU" in text and "| 8 | " in text and "| 64 | " in text
    with pytest.raises(SystemExit) as exit_info:
        main(["--compute-ms", "5", "--encode-gbps", "0", "--decode-gbps", "1", "--cast-gbps", "1"])
    assert exit_info.value.code == 2  # argparse's error exit, naming the bad input on stderr
