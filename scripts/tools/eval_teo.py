#!/usr/bin/env python
"""Evaluate a Hugging Face image-text-to-text model on TEO (+ ISO, COHERENCE) by prompting.

    python scripts/tools/eval_teo.py --model OpenGVLab/InternVL3_5-8B-HF --procedures data/mateo/test.jsonl
    python scripts/tools/eval_teo.py --model /models/qwen2.5-vl-7b --synthetic --strategies baseline,cot --modalities image
    python scripts/tools/eval_teo.py --model /models/x --procedures p.jsonl --tasks teo,iso,coherence --set iso.ks=[2,3]
    python scripts/tools/eval_teo.py --model logs/teo_lora_internvl/runs/RUN/adapter --procedures data/mateo/test.jsonl

A fine-tuned TEO model: ``--model RUN/adapter`` (the LoRA adapter, loaded on its base model) or
``RUN/adapter/merged`` (the merged model, ``model.merge_adapter=true``). Their ``seqaware_inputs.json``
gives the defaults of ``--prompt`` (the prompt it was trained on: ``finetune``, MATEO Table 6) and
``--image-tiles`` (the tiling it was trained on), so the inputs are built as in training and its
in-training test.

Defaults come from ``configs/eval/teo.yaml`` (``--config`` another file; ``--set key=value`` any
dotted key). TEO pairs are built with ``data_modules.tasks.teo.teo_eval_sets`` from the procedures
of ``--split`` and evaluated on the original and swapped sets; ISO / COHERENCE instances with
``data_modules.tasks.{iso,coherence}``. For each (task, strategy, modality) the script writes
``<out_dir>/<model slug>/<task>_<strategy>_<modality>.{md,json,png}`` (baselines as rows) and
prints the table. Raw replies are cached in ``<out_dir>/<model slug>/raw_outputs.jsonl``:
rerunning the same command only generates what is missing (an interrupted run resumes).
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from data_modules.tasks.coherence import coherence_instances  # noqa: E402
from data_modules.tasks.iso import iso_instances  # noqa: E402
from data_modules.tasks.teo import teo_eval_sets, teo_options  # noqa: E402
from seqaware.procedure import Procedure, read_procedures  # noqa: E402
from seqaware.vlm.inputs import read_record  # noqa: E402
from seqaware.vlm.prompts import ISO_STRATEGIES, MODALITIES, STRATEGIES  # noqa: E402
from seqaware.vlm.protocols import evaluate_coherence, evaluate_iso, evaluate_teo  # noqa: E402
from seqaware.vlm.protocols.teo import PROMPTS  # noqa: E402
from seqaware.vlm.runner import OutputCache, load_hf_generator, slug, write_result  # noqa: E402

log = logging.getLogger("eval_teo")
DEFAULT_CONFIG = ROOT / "configs" / "eval" / "teo.yaml"
TASKS = ("teo", "iso", "coherence")


def _names(value: Any, valid: Sequence[str], what: str) -> list[str]:
    """A comma-separated string or list -> validated names; ``all`` means every valid name."""
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else [str(v) for v in value]
    if names == ["all"]:
        return list(valid)
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        raise SystemExit(f"unknown {what} {unknown or names}; valid: {', '.join(valid)} (or all)")
    return names


def parse_config(argv: Sequence[str] | None = None) -> Any:
    """The YAML defaults merged with command-line flags and ``--set`` overrides (an OmegaConf dict)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="YAML with the defaults")
    parser.add_argument("--model", help="Hugging Face name or local folder")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--procedures", help="prepared procedures JSONL (with DAGs for TEO)")
    source.add_argument("--synthetic", action="store_true", default=None, help="use the embedded synthetic world")
    parser.add_argument("--split", help="evaluate procedures of this split only ('all' = every split)")
    parser.add_argument("--tasks", help="comma-separated: teo,iso,coherence")
    parser.add_argument("--strategies", help="TEO strategies, comma-separated or all")
    parser.add_argument("--modalities", help="TEO modalities, comma-separated or all")
    parser.add_argument("--iso-strategies", dest="iso_strategies", help="answer_only,explain")
    parser.add_argument("--prompt", choices=PROMPTS, help="TEO prompts: eval (Table 5, per strategy) or finetune "
                        "(Table 6, the LoRA recipe's; instructions only); default: the --model folder's training prompt, else eval")
    parser.add_argument("--image-tiles", dest="image_tiles", type=int,
                        help="most tiles per image (InternVL processors); default: the --model folder's, else the processor's")
    parser.add_argument("--batch-size", dest="batch_size", type=int)
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    parser.add_argument("--limit", type=int, help="at most this many procedures")
    parser.add_argument("--out-dir", dest="out_dir")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key (repeatable), e.g. --set iso.max_candidates=2")
    args = parser.parse_args(argv)
    if not args.config.is_file():
        raise SystemExit(f"--config: no such file: {args.config}")
    cfg = OmegaConf.load(args.config)
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "overrides") and v is not None}
    if flags.get("procedures"):
        flags["synthetic"] = False
    if flags.get("split") == "all":
        flags["split"] = None
    cfg = OmegaConf.merge(cfg, OmegaConf.create(flags), OmegaConf.from_dotlist(args.overrides))
    cfg.tasks = _names(cfg.tasks, TASKS, "tasks")
    cfg.strategies = _names(cfg.strategies, STRATEGIES, "strategies")
    cfg.modalities = _names(cfg.modalities, MODALITIES, "modalities")
    cfg.iso_strategies = _names(cfg.iso_strategies, ISO_STRATEGIES, "ISO strategies")
    return cfg


def synthetic_world(name: str) -> dict[str, Any]:
    """The synthetic world's settings from ``configs/source/<name>.yaml`` (their one home, shared with
    the training data configs), without the Hydra source keys."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder = ROOT / "configs" / "source"
    if not (folder / f"{name}.yaml").is_file():
        choices = sorted(p.stem for p in folder.glob("synthetic*.yaml"))
        raise SystemExit(f"synthetic_source={name!r}: no configs/source/{name}.yaml (choose one of {choices})")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
        source = OmegaConf.to_container(compose(config_name=name), resolve=False)
    GlobalHydra.instance().clear()
    return {k: v for k, v in source.items() if not k.startswith("_") and k != "cache_dir"}


def load_procedures(cfg: Any) -> tuple[list[Procedure], Path]:
    """The procedures to evaluate (``cfg.split`` only, at most ``cfg.limit``) and their image root."""
    if cfg.synthetic:
        from data_modules.synthetic import SyntheticConfig, ensure_synthetic

        world = {**synthetic_world(cfg.synthetic_source), **OmegaConf.to_container(cfg.synthetic_config)}
        folder = ensure_synthetic(SyntheticConfig(**world), cfg.synthetic_cache_dir, progress=False)
        files = [Path(folder) / f"{s}.jsonl" for s in ("train", "val", "test")]
    elif cfg.procedures:
        files = [Path(cfg.procedures)]
        if not files[0].is_file():
            raise SystemExit(f"--procedures: no such file: {files[0]}")
    else:
        raise SystemExit("no data: give --procedures PATH or --synthetic")
    procedures = [p for f in files for p in read_procedures(f)]
    if cfg.split:
        procedures = [p for p in procedures if p.split == cfg.split]
    if cfg.limit is not None:
        procedures = procedures[: int(cfg.limit)]
    if not procedures:
        raise SystemExit(f"no procedures of split {cfg.split!r} in {', '.join(map(str, files))}")
    return procedures, files[0].parent


def model_inputs(cfg: Any) -> tuple[str, int | None, list[str]]:
    """``(prompt, image_tiles, strategies)``: the config's, with ``null`` taken from the ``--model`` folder's
    ``seqaware_inputs.json`` (a fine-tuned TEO model), else ``eval`` / the processor's default tiling. The
    ``finetune`` prompt is one prompt, read as the ``instructions`` strategy: the strategies become that one."""
    record = read_record(cfg.model) if Path(str(cfg.model)).is_dir() else None
    record = record or {}
    prompt = cfg.get("prompt") or record.get("prompt") or "eval"
    if prompt not in PROMPTS:
        raise SystemExit(f"prompt must be one of {', '.join(PROMPTS)}, got {prompt!r}")
    tiles = cfg.get("image_tiles")
    tiles = record.get("image_tiles") if tiles is None else int(tiles)
    strategies = list(cfg.strategies)
    if prompt == "finetune" and strategies != ["instructions"]:
        log.info("prompt=finetune (MATEO Table 6) is read as strategy instructions: not asking %s",
                 ", ".join(s for s in strategies if s != "instructions") or "-")
        strategies = ["instructions"]
    return prompt, tiles, strategies


def run(cfg: Any, generate: Callable | None = None, signature: str | None = None) -> list[dict[str, Any]]:
    """Evaluate every requested (task, strategy, modality); returns the results (also written to disk).

    ``generate`` replaces the Hugging Face model (tests); ``signature`` then names the fake model.
    """
    procedures, root = load_procedures(cfg)
    prompt, image_tiles, strategies = model_inputs(cfg)
    if generate is None:
        generator = load_hf_generator(cfg.model, max_new_tokens=cfg.max_new_tokens, dtype=cfg.dtype, device=cfg.device,
                                      trust_remote_code=cfg.trust_remote_code, image_tiles=image_tiles)
        generate, signature = generator, generator.signature
    signature = signature or f"{cfg.model}|max_new_tokens={cfg.max_new_tokens}"
    out_dir = Path(cfg.out_dir) / slug(cfg.model)
    cache = OutputCache(out_dir / "raw_outputs.jsonl")
    common = {"generate": generate, "cache": cache, "model_name": str(cfg.model), "signature": signature,
              "image_root": root, "batch_size": int(cfg.batch_size), "seed": int(cfg.seed)}
    results = []
    if "teo" in cfg.tasks:
        eval_sets = teo_eval_sets(procedures, teo_options(cfg.teo))
        if not eval_sets["original"]:
            raise SystemExit("no TEO pairs: the selected procedures have no dependency DAG")
        log.info("TEO: %d pairs x 2 presentations", len(eval_sets["original"]))
        for strategy in strategies:
            for modality in cfg.modalities:
                results.append(evaluate_teo(eval_sets, strategy=strategy, modality=modality,
                                            variant=cfg.prompts.teo.variant, prompt=prompt, **common))
    if "iso" in cfg.tasks:
        iso_cfg = OmegaConf.to_container(cfg.iso)
        instances = [inst for p in procedures for inst in iso_instances(p, **iso_cfg)]
        log.info("ISO: %d instances", len(instances))
        for strategy in cfg.iso_strategies:
            results.append(evaluate_iso(instances, strategy=strategy, **common))
    if "coherence" in cfg.tasks:
        coh_cfg = OmegaConf.to_container(cfg.coherence)
        coh_cfg["difficulty_bins"] = [tuple(b) for b in coh_cfg["difficulty_bins"]]
        instances = coherence_instances(procedures, **coh_cfg)
        log.info("COHERENCE: %d instances", len(instances))
        results.append(evaluate_coherence(instances, **common))
    for result in results:
        result["image_tiles"] = image_tiles  # None: the processor's own default
        paths = write_result(result, out_dir)
        print(f"\n## {result['task']} | {result['strategy']} | {result['modality']}  ({paths['md']})\n{result['table']}")
        if result.get("reflection"):
            print("self-reflection:", result["reflection"])
    return results


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    run(parse_config(argv))


if __name__ == "__main__":
    main()
