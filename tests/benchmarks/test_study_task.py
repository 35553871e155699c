"""benchmarks/study_task.py: the training study's tasks, their scores, splits and demonstrations."""

from __future__ import annotations

import pytest

from benchmarks import study_task


def test_study_task_answers_and_scores():
    ramble, copy = study_task.TASKS["ramble"], study_task.TASKS["copy"]
    assert ramble.answer("58") == "58" * 16 and copy.answer("07") == "07" * 8
    assert ramble.score("58" * 16, "58") == 1.0
    assert ramble.score("58" * 15 + "50", "58") == pytest.approx(31 / 32)
    assert ramble.score("58" * 16 + "1" * 32, "58") == pytest.approx(0.5)  # too long: over its own length
    assert copy.score("0707", "07") == pytest.approx(4 / 16)  # too short: over the answer's length
    train, held_out = study_task.split_patterns(3)
    assert len(train) == 80 and len(held_out) == 20 and not set(train) & set(held_out)
    assert study_task.split_patterns(3) == (train, held_out) and study_task.split_patterns(4) != (train, held_out)


def test_study_task_demonstrations_follow_their_design():
    rng = __import__("random").Random(0)
    ramble, copy = study_task.TASKS["ramble"], study_task.TASKS["copy"]
    demos = [ramble.demonstration("58", rng) for _ in range(2000)]
    exact = sum(d == ramble.answer("58") for d in demos) / len(demos)
    assert abs(exact - ramble.correct_share) < 0.04
    # a ramble: right for k < 32 characters, then 180 to 250 random digits
    assert all(d == ramble.answer("58") or 180 <= len(d) <= 250 + 31 for d in demos)
    copies = [copy.demonstration("58", rng) for _ in range(500)]
    kept = sum(a == b for d in copies for a, b in zip(d, copy.answer("58"))) / (500 * 16)
    assert all(len(d) == 16 for d in copies) and abs(kept - (0.85 + 0.15 / 10)) < 0.02
