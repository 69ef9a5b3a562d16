"""Dataset adapters: raw releases -> procedures (+ task instances), and a cached Hydra source.

Each adapter is a function ``convert(src, out_images, **options) -> AdapterResult`` (see
:mod:`data_modules.adapters.common`) in a module of this package, registered under its dataset name
with ``@ADAPTERS.register("NAME")``; the module's docstring says what release it reads.
``ADAPTERS`` holds every one (``python scripts/tools/prepare_data.py --help`` lists them).

The registry and option checking live in :mod:`data_modules.adapters.registry`; the cached Hydra
source over it (``configs/data/{wikihow,recipeqa,mateo,rfg}.yaml``) is
:func:`data_modules.sources.adapter_source`; :mod:`data_modules.adapters.prepare` writes a prepared
folder. This package file only hands those names on."""
from __future__ import annotations

from data_modules.adapters.common import AdapterOptionError, AdapterResult
from data_modules.adapters.registry import ADAPTERS, adapter_options, cache_key, get_adapter, run_adapter

__all__ = ["ADAPTERS", "AdapterOptionError", "AdapterResult", "adapter_options", "cache_key", "get_adapter",
           "run_adapter"]
