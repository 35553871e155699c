"""benchmarks/overhead.py: each piece of OTB's per-step cost is timed (no timing is asserted)."""

from __future__ import annotations

from benchmarks import overhead


def test_overhead_pieces_time_each_piece():
    pieces = overhead.time_pieces(repeats=3)
    assert set(pieces) == {"collector_per_token", "otb_advantages", "otb_diagnostics"}
    assert all(us > 0 for us in pieces.values())
