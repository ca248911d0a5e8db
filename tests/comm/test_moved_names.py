"""Names that moved out of comm/exchange.py (the pooled layout to comm/pooled.py, the layout base to comm/base.py, the
result buffers to comm/buffers.py) still import from there for one release, with a DeprecationWarning that names their
new home, as do the module bases from comm/recorder.py (now in comm/base.py). Wrappers set on a module reach the
callers that look the name up there: the pooled functions on pooled, the wire functions on exchange."""

from __future__ import annotations

import pytest
import torch

from lightning_dlac.comm import base, buffers, exchange, pooled, recorder

# Every public name exchange.py defined before the split, and where it is defined now.
BEFORE_THE_SPLIT = {
    "CompressedExchangeError": exchange, "offsets": exchange, "rank_sums": exchange, "ChunkCodec": exchange,
    "Impl": exchange, "Grid": exchange, "InFlight": exchange, "encode_chunks": exchange, "decode_chunks": exchange,
    "assemble": exchange, "as_bytes": exchange, "copy_raw": exchange, "to_wire": exchange, "from_wire": exchange,
    "place_rows": exchange, "place_own": exchange, "with_own": exchange, "exchange_sizes": exchange,
    "exchange_unknown_sizes": exchange, "size_records_plan": exchange, "start_payload": exchange,
    "start_cast": exchange, "ResultBuffers": buffers, "TableLayout": base, "Layout": pooled, "Encoded": pooled,
    "encode_for_others": pooled, "start_forward": pooled, "start_output": pooled, "decode_from_others": pooled,
    "adjacent": pooled, "start_forward_uncompressed": pooled, "finish_forward_uncompressed": pooled,
    "locate_decode_error": pooled, "BackwardInFlight": pooled, "gather_owner_blocks": pooled,
    "start_gradient": pooled, "start_backward_cast": pooled, "start_backward_mixed_cast": pooled,
    "start_backward_dlac": pooled, "finish_backward": pooled,
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(BEFORE_THE_SPLIT))
def test_every_name_of_the_old_exchange_module_is_still_there(name: str) -> None:
    namespace: dict[str, object] = {}
    home = BEFORE_THE_SPLIT[name]
    if home is exchange:
        exec(f"from lightning_dlac.comm.exchange import {name}", namespace)  # the import statement callers write
    else:
        with pytest.warns(DeprecationWarning, match=rf"exchange\.{name} is deprecated: it moved to"
                                                    rf" {home.__name__}\.{name}"):
            exec(f"from lightning_dlac.comm.exchange import {name}", namespace)
    assert namespace[name] is getattr(home, name)


def test_the_module_bases_are_still_importable_from_the_recorder() -> None:
    with pytest.warns(DeprecationWarning, match=r"recorder\.RecordedExchange is deprecated: it moved to"
                                                r" lightning_dlac\.comm\.base\.RecordedExchange"):
        from lightning_dlac.comm.recorder import Ready, RecordedExchange

    assert (Ready, RecordedExchange) == (base.Ready, base.RecordedExchange)
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        recorder.Nothing  # noqa: B018


def _one_rank_output() -> torch.Tensor:
    """decode_from_others on a layout of one rank: nothing arrives, the output is the block the rank kept."""
    layout = pooled.Layout(0, (("t",),), ((4,),))
    own = torch.arange(12.0).view(3, 4)
    return pooled.decode_from_others(torch.zeros(0, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64), own,
                                     layout, "ref")


def test_a_wire_function_set_on_exchange_is_what_pooled_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    original, calls = exchange.place_own, []
    monkeypatch.setattr(exchange, "place_own", lambda *a, **k: calls.append(1) or original(*a, **k))
    torch.testing.assert_close(_one_rank_output(), torch.arange(12.0).view(3, 4))
    assert calls == [1]


def test_an_unknown_name_of_exchange_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'lightning_dlac.comm.exchange' has no attribute 'nothing'"):
        exchange.nothing  # noqa: B018
