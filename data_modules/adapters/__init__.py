"""Dataset adapters: raw releases -> procedures (+ task instances), and a cached Hydra source.

Each adapter is a function ``convert(src, out_images, **options) -> AdapterResult`` (see
:mod:`data_modules.adapters.common`). ``ADAPTERS`` maps dataset names to them:

=============  ==========================================================================
name           source
=============  ==========================================================================
wikihow        Wu et al. 2022 WikiHow JSON lines (one section = one procedure)
recipeqa       Wu et al. 2022 RecipeQA splits ``{train,val,test}-acl22.json`` + images
mateo          MATEO JSON / JSONL export or parquet (step DAG from out-nodes)
rfg            English Recipe Flow Graph ``.list`` + ``.flow`` (step DAG from flow edges)
catbench       CaT-Bench questions (plans + gold yes/no TEO-style pairs)
roc            ROCStories / SIND tsv (one story per line, `` <eos> `` between sentences)
iso            ISO-Bench export read through a field mapping -> ISO instances
coherence      COHERENCE export read through a field mapping -> COHERENCE instances
=============  ==========================================================================

The registry and option checking live in :mod:`data_modules.adapters.registry`; the cached Hydra
source over it (``configs/data/{wikihow,recipeqa,mateo,rfg}.yaml``) is
:func:`data_modules.sources.adapter_source`; :mod:`data_modules.adapters.prepare` writes a prepared
folder. This package file only hands those names on.
"""
from __future__ import annotations

from data_modules.adapters.common import AdapterOptionError, AdapterResult
from data_modules.adapters.registry import ADAPTERS, adapter_options, cache_key, get_adapter, run_adapter

__all__ = ["ADAPTERS", "AdapterOptionError", "AdapterResult", "adapter_options", "cache_key", "get_adapter",
           "run_adapter"]
