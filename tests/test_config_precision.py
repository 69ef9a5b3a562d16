"""auto_precision: bf16-mixed on GPUs and on CPUs with fast bf16, 32-true otherwise; SEQAWARE_CPU_BF16 forces the answer."""
from __future__ import annotations

import pytest

from seqaware.config import auto_precision, cpu_has_fast_bf16


def test_the_cpu_answer_can_be_forced(monkeypatch):
    monkeypatch.setenv("SEQAWARE_CPU_BF16", "0")
    assert cpu_has_fast_bf16() is False and auto_precision("cpu") == "32-true"
    monkeypatch.setenv("SEQAWARE_CPU_BF16", "1")
    assert cpu_has_fast_bf16() is True and auto_precision("cpu") == "bf16-mixed"
    assert auto_precision("gpu") == "bf16-mixed"
    monkeypatch.setenv("SEQAWARE_CPU_BF16", "yes")
    with pytest.raises(ValueError, match="SEQAWARE_CPU_BF16 must be 0 or 1, got 'yes'"):
        cpu_has_fast_bf16()
