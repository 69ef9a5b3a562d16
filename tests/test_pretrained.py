"""Pretrained weights: offline aliases load; unavailable hub names fail fast with a clear message."""
from __future__ import annotations

import time

import pytest

from seqaware import pretrained
from seqaware.pretrained import PretrainedUnavailableError, load_tokenizer, resolve_name


def test_offline_minilm_tokenizer_loads():
    tok = load_tokenizer("offline:minilm")
    assert len(tok) == 30522
    assert tok("Mix the flour.")["input_ids"][0] == tok.cls_token_id
    assert resolve_name("offline:minilm").endswith("model")


@pytest.mark.parametrize("offline_env", ["1", None])
def test_hub_name_fails_fast_with_instructions(monkeypatch, offline_env):
    if offline_env is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

        def hanging_connection(*args, **kwargs):  # a network that never answers
            time.sleep(60)

        monkeypatch.setattr(pretrained.socket, "create_connection", hanging_connection)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", offline_env)
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError) as err:
        load_tokenizer("seqaware-test/definitely-not-cached-model")
    assert time.monotonic() - start < 15
    message = str(err.value)
    assert "backbones.tokenizer=/path/to/folder" in message and "offline:minilm" in message
