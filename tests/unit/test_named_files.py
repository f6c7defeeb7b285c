"""Files a person names, read by the facts: a model's config.json and weight index, the shebang of vLLM's
command. The rule (supervisor/named_files.py): a link is followed (the person chose the path), but only
a regular file is read, opened without blocking, never past its bound. So whatever sits at those names
(a FIFO, a socket, a directory, a device, a file far too large) is refused at once with a warning that
names the file and what it is, and the facts go on without it; nothing waits for a writer that never
comes."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.facts import model_files, vllm_install
from supervisor.named_files import read_named_optional

#: A call that does not return within this long is a hang (each one here takes milliseconds).
PROMPT_S = 5.0


def _within(seconds: float, call):
    """``call()``'s result, or a failure when it has not returned after ``seconds`` (a FIFO's open that
    waits for a writer): the thread is released by opening the FIFOs' other ends."""
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.setdefault("got", call()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s"
    return box.get("got")


def _plant(path: Path, kind: str) -> str:
    """Put ``kind`` at ``path``; the words the warning must use for it."""
    if kind == "fifo":
        os.mkfifo(path)
        return "a FIFO"
    if kind == "directory":
        path.mkdir()
        return "a directory"
    if kind == "device":
        path.symlink_to("/dev/zero")          # a link is followed: what it names is a device, never ending
        return "a character device"
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
        return "No such device or address"    # open(2) of a socket: ENXIO
    if kind == "huge":
        with open(path, "wb") as f:           # sparse: 16 MiB and one byte, over config.json's 16 MiB bound
            f.truncate((16 << 20) + 1)
        return "larger than 16 MiB"
    raise AssertionError(kind)


KINDS = ("fifo", "directory", "device", "socket", "huge")


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_config_that_is_not_a_file_to_read_is_refused_at_once_naming_it(tmp_path, kind):
    said = _plant(tmp_path / "config.json", kind)
    with capture_logs() as logs:
        got = _within(PROMPT_S, lambda: model_files.load_model_info(str(tmp_path), online=False))
    assert got is None
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and str(tmp_path / "config.json") in warnings[0] and said in warnings[0], warnings


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "socket"])
def test_a_weight_index_that_is_not_a_file_is_refused_and_the_weights_are_the_files_sizes(tmp_path, kind):
    said = _plant(tmp_path / "model.safetensors.index.json", kind)
    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 1234)
    (tmp_path / "model-00002.safetensors").write_bytes(b"\0" * 766)
    with capture_logs() as logs:
        got = _within(PROMPT_S, lambda: model_files.weights_bytes_in(str(tmp_path)))
    assert got == (1234 + 766, "files")
    warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1 and "model.safetensors.index.json" in warnings[0] and said in warnings[0], warnings


def test_a_weight_index_is_read_through_a_link_as_the_hub_cache_keeps_it(tmp_path):
    blob = tmp_path / "blob"
    blob.write_text('{"metadata": {"total_size": 16060522496}}')
    (tmp_path / "model.safetensors.index.json").symlink_to(blob)
    assert model_files.weights_bytes_in(str(tmp_path)) == (16060522496, "index")


def test_a_fifo_planted_as_vllms_command_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "vllm"
    os.mkfifo(fifo)
    fifo.chmod(0o755)                         # executable, so PATH lookup finds it
    assert _within(PROMPT_S, lambda: vllm_install.interpreter(["vllm"], path=str(tmp_path))) is None


def test_a_huge_command_is_read_only_as_far_as_its_shebang(tmp_path):
    script = tmp_path / "vllm"
    with open(script, "wb") as f:
        f.write(b"#!/opt/vllm/bin/python3 -s\n")
        f.truncate(1 << 30)                   # a 1 GiB file: only its first 300 bytes are read
    script.chmod(0o755)
    assert _within(PROMPT_S, lambda: vllm_install.interpreter(["vllm"], path=str(tmp_path))) == "/opt/vllm/bin/python3"


def test_an_absent_named_file_is_none_and_a_head_read_stops_at_its_bound(tmp_path):
    assert read_named_optional(str(tmp_path / "nope"), "the model's config", 10, "10 bytes") is None
    (tmp_path / "f").write_bytes(b"0123456789abcdef")
    assert read_named_optional(str(tmp_path / "f"), "vLLM's command", 10, "10 bytes", head=True) == b"0123456789"
