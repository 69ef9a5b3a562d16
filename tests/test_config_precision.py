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


@pytest.fixture
def cpu(monkeypatch):
    """Set what the CPU detection reads: whether oneDNN has bf16 kernels, and /proc/cpuinfo's text (an
    exception instance: reading it raises that)."""
    import pathlib

    import torch

    monkeypatch.delenv("SEQAWARE_CPU_BF16", raising=False)
    real_read = pathlib.Path.read_text

    def set_cpu(onednn_bf16: bool, cpuinfo):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn_bf16)

        def read_text(self, *args, **kwargs):
            if str(self) != "/proc/cpuinfo":
                return real_read(self, *args, **kwargs)
            if isinstance(cpuinfo, BaseException):
                raise cpuinfo
            return cpuinfo

        monkeypatch.setattr(pathlib.Path, "read_text", read_text)

    return set_cpu


@pytest.mark.parametrize("onednn, cpuinfo, fast", [
    (True, "flags\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n", True),
    (True, "flags\t: fpu avx2 amx_bf16 amx_tile amx_int8\n", True),
    (True, "flags\t: fpu sse2 avx2 avx512f\n", False),       # AVX-512 without its bf16 instructions
    (False, "flags\t: fpu avx512_bf16 amx_bf16\n", False),   # oneDNN without bf16 kernels: slow whatever the flags
    (True, OSError("no /proc"), False),
    (True, RuntimeError("odd"), False),
])
def test_without_the_variable_the_answer_is_the_cpus_bf16_instructions(cpu, onednn, cpuinfo, fast):
    cpu(onednn, cpuinfo)
    assert cpu_has_fast_bf16() is fast
    assert auto_precision("cpu") == ("bf16-mixed" if fast else "32-true")


def test_an_empty_or_padded_variable(cpu, monkeypatch):
    cpu(True, "flags\t: avx2\n")
    monkeypatch.setenv("SEQAWARE_CPU_BF16", "")          # set but empty: the CPU decides
    assert cpu_has_fast_bf16() is False
    monkeypatch.setenv("SEQAWARE_CPU_BF16", " 1 ")
    assert cpu_has_fast_bf16() is True


@pytest.mark.parametrize("accelerator, cuda, fast, precision", [
    ("cuda", False, False, "bf16-mixed"), ("gpu", False, False, "bf16-mixed"),
    ("auto", True, False, "bf16-mixed"), ("auto", False, False, "32-true"), ("auto", False, True, "bf16-mixed"),
    ("cpu", True, False, "32-true"),                     # a GPU present but not asked for
])
def test_auto_precision_by_accelerator(monkeypatch, accelerator, cuda, fast, precision):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("SEQAWARE_CPU_BF16", "1" if fast else "0")
    assert auto_precision(accelerator) == precision
