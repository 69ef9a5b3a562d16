#!/usr/bin/env python
"""Pretrained weights in parts small enough for a size-limited transfer, and back into a model folder.

    python scripts/maintenance/weight_parts.py pack offline:mpnet .gpu/mpnet            # parts of at most 40 MiB + manifest.json
    python scripts/maintenance/weight_parts.py verify .gpu/mpnet [FOLDER ...]            # which parts are here, missing, corrupt
    python scripts/maintenance/weight_parts.py unpack /tmp/mpnet /tmp/sa/mpnet [FOLDER ...]   # a folder AutoModel loads

The device tool carries at most 64 MiB a call (git show e8b4d3f:docs/results/sequencing.md, its last section);
MPNet-base is 438 MB in float32.  ``pack`` reads a Hugging Face model folder (or an offline alias of
:mod:`seqaware.pretrained`) and writes one byte stream cut into ``part-NNN.bin`` files of equal size, none over
``--max-mib``, and ``manifest.json`` (each part's size and SHA-256, where each file and tensor lies in the
stream).  The stream holds, in this order:

* the folder's top-level files other than weights (config, tokenizer, sentence-transformers files): always
  in part 0, which is refused (nothing written) when they do not fit in one part;
* every 2-D floating-point tensor as int8, one float32 scale per row (``max |row| / 127``; each value within
  half its row's scale of the original);
* every other floating-point tensor in float16 (raw bytes where float16 would overflow), other tensors raw.

MPNet-base packs into 3 parts of about 37 MB (110 MB: int8 is 4x smaller than float32; zlib saves only a
further 8% of such int8 matrices, so the stream is not compressed).  Quantised this way, all-mpnet-base-v2's
sentence embeddings keep a cosine of 0.9995 to the float32 model's.

``unpack`` takes the manifest and the parts from one or more folders (the first copy whose SHA-256 matches
is used), names every part that is missing or corrupt at once, and writes ``DEST``: the files, and
``model.safetensors`` with every tensor back in its original dtype (float32 for MPNet), so
``AutoModel.from_pretrained(DEST)`` and ``backbones.text=DEST backbones.tokenizer=DEST`` load it with no
package beyond torch, safetensors and transformers.  ``DEST`` is built beside itself and moved into place
(:func:`seqaware.io.build_folder_once`); a finished ``DEST`` of the same manifest is reused.  Every name the
manifest gives a file must be one plain file name (:func:`check_names`): a manifest naming ``../x``, ``/etc/x``
or ``sub/x``, or a file of ``unpack_files`` that is a symbolic link in ``DEST``, is refused naming the entry,
before anything is written.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FORMAT = "seqaware-weight-parts/1"
MANIFEST = "manifest.json"
UNPACKED_MANIFEST = "weight_parts_manifest.json"   # the manifest a finished DEST was built from
MIB = 1 << 20
DEFAULT_MAX_MIB = 40.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot", ".ckpt", ".index.json")
FP16_MAX = 65504.0


class PartsError(RuntimeError):
    """Parts that cannot be packed or unpacked; the message names every file concerned."""


def part_name(index: int) -> str:
    return f"part-{index:03d}.bin"


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


# ---------------------------------------------------------------- reading a model folder
def model_files(folder: Path) -> list[Path]:
    """The folder's top-level files that are not weights (config, tokenizer, ...), by name; hidden files left out."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and not p.name.endswith(WEIGHT_SUFFIXES))


def load_state_dict(folder: Path) -> dict[str, Any]:
    """Every tensor of ``model*.safetensors`` (one file or shards), else of ``pytorch_model.bin``."""
    import torch
    from safetensors.torch import load_file

    shards = sorted(folder.glob("model*.safetensors"))
    if shards:
        state: dict[str, Any] = {}
        for shard in shards:
            state.update(load_file(str(shard)))
        return state
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise PartsError(f"{folder}: no model*.safetensors or pytorch_model.bin to pack")


# ---------------------------------------------------------------- encoding
def quantise_rows(tensor) -> tuple[Any, Any]:
    """``(int8 values, float32 scale per row)`` of a 2-D tensor: ``q = round(w / s)``, ``s = max |row| / 127``
    (an all-zero row gets scale 0 and zeros)."""
    import torch

    w = tensor.detach().to(torch.float32)
    scale = w.abs().amax(dim=1) / 127.0
    q = torch.round(w / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None]).clamp_(-127, 127)
    return q.to(torch.int8), scale


def dequantise_rows(q, scale, dtype):
    """``q * s`` per row, in ``dtype``."""
    import torch

    return (q.to(torch.float32) * scale[:, None]).to(dtype)


def _raw_bytes(tensor) -> bytes:
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_tensor(name: str, tensor) -> tuple[dict[str, Any], list[bytes]]:
    """The manifest entry (without its offset) and the byte chunks of one tensor."""
    import torch

    entry: dict[str, Any] = {"name": name, "dtype": _dtype_name(tensor.dtype), "shape": list(tensor.shape)}
    if tensor.is_floating_point() and tensor.dim() == 2 and tensor.numel() > 0:
        q, scale = quantise_rows(tensor)
        entry["encoding"] = "int8-rows"
        chunks = [scale.numpy().tobytes(), q.numpy().tobytes()]
    elif tensor.is_floating_point() and (tensor.numel() == 0 or float(tensor.abs().max()) <= FP16_MAX):
        entry["encoding"] = "float16"
        chunks = [tensor.detach().to(torch.float16).contiguous().numpy().tobytes()]
    else:
        entry["encoding"] = "raw"
        chunks = [_raw_bytes(tensor)]
    entry["bytes"] = sum(len(c) for c in chunks)
    return entry, chunks


def decode_tensor(entry: dict[str, Any], data: bytes):
    import torch

    dtype = getattr(torch, entry["dtype"])
    shape = entry["shape"]
    buffer = bytearray(data)
    if entry["encoding"] == "int8-rows":
        rows = shape[0]
        scale = torch.frombuffer(buffer, dtype=torch.float32, count=rows) if rows else torch.zeros(0)
        q = torch.frombuffer(buffer, dtype=torch.int8, offset=4 * rows).reshape(shape)
        return dequantise_rows(q, scale, dtype)
    if entry["encoding"] == "float16":
        if not buffer:
            return torch.zeros(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=torch.float16).reshape(shape).to(dtype)
    if entry["encoding"] == "raw":
        if not buffer:
            return torch.zeros(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape).clone()
    raise PartsError(f"tensor {entry['name']}: unknown encoding {entry['encoding']!r} in the manifest")


# ---------------------------------------------------------------- pack
def pack(source: str | Path, dest: Path, max_mib: float = DEFAULT_MAX_MIB) -> dict[str, Any]:
    """Write ``dest/part-NNN.bin`` (equal sizes, each at most ``max_mib`` MiB) and ``dest/manifest.json``;
    returns the manifest.  Nothing is written when the files do not fit in part 0 or ``dest`` is not empty."""
    from seqaware.io import atomic_open
    from seqaware.pretrained import resolve_name

    folder = Path(resolve_name(str(source), "weight_parts.py pack SOURCE"))
    if not folder.is_dir():
        raise PartsError(f"{source}: no such model folder")
    limit = int(max_mib * MIB)
    if limit < 1:
        raise PartsError(f"--max-mib {max_mib}: must be positive")
    if dest.exists() and any(dest.iterdir()):
        raise PartsError(f"{dest}: not empty; pack writes into an empty or new folder")
    chunks: list[bytes] = []
    offset = 0
    files, tensors = [], []
    for path in model_files(folder):
        data = path.read_bytes()
        files.append({"name": path.name, "offset": offset, "bytes": len(data)})
        chunks.append(data)
        offset += len(data)
    files_end = offset
    for name, tensor in load_state_dict(folder).items():
        entry, parts = encode_tensor(name, tensor)
        entry["offset"] = offset
        tensors.append(entry)
        chunks.extend(parts)
        offset += entry["bytes"]
    stream = b"".join(chunks)
    count = max(1, math.ceil(len(stream) / limit))
    size = math.ceil(len(stream) / count)          # equal parts, the last one shorter ...
    if files_end > size:
        size = limit                               # ... unless the files need a full part 0
    if files_end > size:
        raise PartsError(f"{folder}: its config and tokenizer files take {files_end:,} bytes, more than a part "
                         f"may hold ({limit:,}): raise --max-mib; nothing written")
    parts = []
    for index in range(count):
        data = stream[index * size:(index + 1) * size]
        if len(data) > limit:  # by construction never; a part over the limit is never written
            raise PartsError(f"{part_name(index)} would take {len(data):,} bytes, over the limit of {limit:,}")
        parts.append({"file": part_name(index), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    dest.mkdir(parents=True, exist_ok=True)
    for index, part in enumerate(parts):
        with atomic_open(dest / part["file"], "wb") as handle:
            handle.write(stream[index * size:(index + 1) * size])
    manifest = {"format": FORMAT, "source": str(source), "max_part_bytes": limit, "total_bytes": len(stream),
                "sha256": hashlib.sha256(stream).hexdigest(), "parts": parts, "files": files, "tensors": tensors}
    with atomic_open(dest / MANIFEST, "w") as handle:
        json.dump(manifest, handle, indent=1)
    return manifest


# ---------------------------------------------------------------- verify / unpack
def read_manifest(folders: Sequence[Path]) -> dict[str, Any]:
    """The one manifest of ``folders`` (copies in several folders must agree)."""
    found = [f / MANIFEST for f in folders if (f / MANIFEST).is_file()]
    if not found:
        raise PartsError(f"no {MANIFEST} in {', '.join(map(str, folders))} (it travels with part 0)")
    texts = {p: p.read_text() for p in found}
    if len(set(texts.values())) > 1:
        raise PartsError(f"{MANIFEST} differs between {', '.join(map(str, found))}: parts of two packs")
    try:
        manifest = json.loads(texts[found[0]])
    except json.JSONDecodeError as err:
        raise PartsError(f"{found[0]}: not JSON ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PartsError(f"{found[0]}: format {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                         f"expected {FORMAT!r}")
    check_names(manifest, found[0])
    return manifest


def _plain_name(name: Any) -> bool:
    """One file name: a non-empty string with no folder part (no ``/``, ``\\``, ``..``, ``.``, absolute path, NUL)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
            and Path(name).name == name)


def check_names(manifest: dict[str, Any], where: Path) -> None:
    """Every name the manifest gives a file is one plain file name: ``files[i].name`` is written into the
    destination folder and ``parts[i].file`` read from a folder of parts, so a name with a folder part
    (``../x``, ``/etc/x``, ``sub/x``) would reach outside them.  PartsError naming every bad entry, before
    anything is read or written."""
    bad = [f"{key}[{i}].{field} {entry.get(field) if isinstance(entry, dict) else entry!r}"
           for key, field in (("files", "name"), ("parts", "file"))
           for i, entry in enumerate(manifest.get(key) or [])
           if not isinstance(entry, dict) or not _plain_name(entry.get(field))]
    if bad:
        raise PartsError(f"{where}: {len(bad)} manifest name(s) that are not plain file names and would leave the "
                         "folder they belong in (a pack names top-level files only: no '/', '..' or absolute path): "
                         + "; ".join(bad) + "; nothing read or written")


def file_targets(manifest: dict[str, Any], dest: Path) -> list[Path]:
    """Where each of the manifest's ``files`` is written in ``dest``; PartsError when one is a symbolic link
    (or not a file) already there, which the write would follow out of ``dest``, naming the entry."""
    targets, bad = [], []
    for i, entry in enumerate(manifest["files"]):
        target = dest / entry["name"]
        if target.is_symlink() or (target.exists() and not target.is_file()):
            kind = f"a symbolic link to {target.readlink()}" if target.is_symlink() else "not a file"
            bad.append(f"files[{i}].name {entry['name']!r}: {target} is {kind}")
        targets.append(target)
    if bad:
        raise PartsError(f"{dest}: the manifest's files would be written through what is there, outside {dest}: "
                         + "; ".join(bad) + "; nothing written")
    return targets


def locate_parts(folders: Sequence[Path], manifest: dict[str, Any]) -> tuple[list[Optional[Path]], list[str]]:
    """Each part's first copy in ``folders`` of the recorded size and SHA-256 (None where there is none),
    and one line per part that is missing or whose copies are all corrupt."""
    found: list[Optional[Path]] = []
    problems: list[str] = []
    total = len(manifest["parts"])
    for index, part in enumerate(manifest["parts"]):
        label = f"{part['file']} (part {index + 1} of {total}, {part['bytes']:,} bytes)"
        copies = [f / part["file"] for f in folders if (f / part["file"]).is_file()]
        good, bad = None, []
        for path in copies:
            size = path.stat().st_size
            if size != part["bytes"]:
                bad.append(f"{path}: {size:,} bytes, the manifest says {part['bytes']:,}")
            elif (digest := sha256_file(path)) != part["sha256"]:
                bad.append(f"{path}: SHA-256 {digest[:16]}... differs from the manifest's {part['sha256'][:16]}...")
            else:
                good = path
                break
        found.append(good)
        if good is None:
            problems.append(f"{label}: corrupt: " + "; ".join(bad) if bad
                            else f"{label}: missing: in none of {', '.join(map(str, folders))}")
    return found, problems


def verify(folders: Sequence[Path]) -> tuple[dict[str, Any], list[Optional[Path]], list[str]]:
    manifest = read_manifest(folders)
    found, problems = locate_parts(folders, manifest)
    return manifest, found, problems


def unpack(folders: Sequence[Path], dest: Path) -> Path:
    """The model folder ``dest`` built from the parts in ``folders``; every missing or corrupt part is named."""
    from safetensors.torch import save_file

    from seqaware.io import build_folder_once

    folders = [Path(f) for f in folders]
    manifest, found, problems = verify(folders)
    if problems:
        raise PartsError(f"cannot unpack {len(manifest['parts'])} parts into {dest}: {len(problems)} "
                         f"missing or corrupt:\n" + "".join(f"  {p}\n" for p in problems))
    marker = dest / UNPACKED_MANIFEST
    if marker.is_file():
        if json.loads(marker.read_text()).get("sha256") != manifest["sha256"]:
            raise PartsError(f"{dest} holds a model unpacked from other parts; remove it or pick another folder")
        return dest

    def build(tmp: Path) -> None:
        stream = b"".join(path.read_bytes() for path in found)
        if hashlib.sha256(stream).hexdigest() != manifest["sha256"]:
            raise PartsError(f"the {len(found)} parts join into a stream whose SHA-256 differs from the manifest's")
        for entry, target in zip(manifest["files"], file_targets(manifest, tmp)):
            target.write_bytes(stream[entry["offset"]:entry["offset"] + entry["bytes"]])
        state = {e["name"]: decode_tensor(e, stream[e["offset"]:e["offset"] + e["bytes"]]) for e in manifest["tensors"]}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / UNPACKED_MANIFEST).write_text(json.dumps(manifest, indent=1))

    return build_folder_once(dest.parent, dest.name, build)


def unpack_files(folders: Sequence[Path], dest: Path) -> Path:
    """The pack's files other than weights (config, tokenizer) written into ``dest``, from part 0 alone (``pack``
    puts them all there): enough to build the architecture with random weights before the other parts arrive.
    Part 0 missing or corrupt is named."""
    folders = [Path(f) for f in folders]
    manifest = read_manifest(folders)
    found, problems = locate_parts(folders, manifest)
    if found[0] is None:
        raise PartsError(f"the files are in part 0: {problems[0]}")
    first = found[0].read_bytes()
    dest.mkdir(parents=True, exist_ok=True)
    for entry, target in zip(manifest["files"], file_targets(manifest, dest)):
        if entry["offset"] + entry["bytes"] > len(first):
            raise PartsError(f"{entry['name']} lies beyond part 0 of {found[0]}: not a pack of this format")
        target.write_bytes(first[entry["offset"]:entry["offset"] + entry["bytes"]])
    return dest


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="a model folder (or offline alias) -> parts + manifest.json")
    p.add_argument("source", help="a Hugging Face model folder, or an offline alias (offline:mpnet)")
    p.add_argument("dest", type=Path, help="an empty or new folder")
    p.add_argument("--max-mib", type=float, default=DEFAULT_MAX_MIB, help="largest part, MiB (default 40)")
    v = sub.add_parser("verify", help="check the parts present in these folders against the manifest")
    v.add_argument("folders", type=Path, nargs="+")
    v.add_argument("--complete", action="store_true", help="exit 1 unless every part is present and intact")
    u = sub.add_parser("unpack", help="parts from one or more folders -> a model folder")
    u.add_argument("dest", type=Path)
    u.add_argument("folders", type=Path, nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            manifest = pack(args.source, args.dest, args.max_mib)
            for part in manifest["parts"]:
                print(f"{args.dest / part['file']}: {part['bytes']:,} bytes, sha256 {part['sha256']}")
            print(f"{args.dest / MANIFEST}: {len(manifest['files'])} files and {len(manifest['tensors'])} tensors, "
                  f"{manifest['total_bytes']:,} bytes in {len(manifest['parts'])} parts")
        elif args.command == "verify":
            manifest, found, problems = verify(args.folders)
            for part, path in zip(manifest["parts"], found):
                if path is not None:
                    print(f"{part['file']}: ok ({path})")
            for problem in problems:
                print(problem)
            corrupt = [p for p in problems if ": corrupt: " in p]
            print(f"{sum(p is not None for p in found)} of {len(found)} parts here and intact"
                  + (f", {len(corrupt)} corrupt" if corrupt else ""))
            return 1 if corrupt or (args.complete and problems) else 0
        else:
            print(f"unpacked into {unpack(args.folders, args.dest)}")
    except PartsError as err:
        print(f"weight_parts.py {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
