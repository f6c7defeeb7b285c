"""Flags as data: parse the user's vLLM args, replace managed flags, never duplicate."""

from supervisor.core.flags import Flags, diff, parse_int


def test_parse_forms_and_get():
    f = Flags.parse(["--max_model_len=8192", "-tp", "2", "--enforce-eager", "--api-key", "s3cret",
                     "--served-model-name", "a", "b"])
    assert f.get("--max-model-len") == "8192"
    assert f.get_int("--tensor-parallel-size") == 2
    assert f.enabled("--enforce-eager")
    assert f.get("--served-model-name") == "a"
    # vLLM's --served-model-name takes one or more names (nargs="+"): "b" is the second name, not a
    # positional argument (vllm serve's parser gives served_model_name=['a', 'b']).
    assert f.get_all("--served-model-name") == ["a", "b"] and f.positionals() == []
    assert f.argv()[-3:] == ["--served-model-name", "a", "b"]


def test_flags_with_several_values_take_every_token_up_to_the_next_flag():
    # The arity of vLLM 0.32's parser (nargs="+"): --api-key K1 K2 are two keys.
    f = Flags.parse(["--api-key", "K1", "K2", "--port", "9000", "--api_key=K3"])
    assert f.get_all("--api-key") == ["K3"] and f.get("--port") == "9000"
    g = Flags.parse(["--api-key", "K1", "K2", "-tp", "2", "MODEL"])
    assert g.get_all("--api-key") == ["K1", "K2"] and g.positionals() == ["MODEL"]
    assert g.argv() == ["--api-key", "K1", "K2", "-tp", "2", "MODEL"]
    assert g.remove("--api-key").argv() == ["-tp", "2", "MODEL"]
    assert Flags.parse(["--hf-token", "--port", "1"]).get("--hf-token") == ""     # nargs="?": alone
    assert Flags.parse(["--max-model-len", "8192", "MODEL"]).positionals() == ["MODEL"]   # one value


def test_set_replaces_in_place_and_keeps_spelling_of_others():
    f = Flags.parse("--foo 1 --max-model-len 131072 --bar")
    g = f.set("--max-model-len", 65408)
    assert g.argv() == ["--foo", "1", "--max-model-len", "65408", "--bar"]
    assert g.argv().count("--max-model-len") == 1
    assert f.get("--max-model-len") == "131072"        # immutable


def test_set_replaces_underscore_spelling_and_duplicates():
    f = Flags.parse("--max_model_len 4096 --max-model-len 8192")
    g = f.set("--max-model-len", "2048")
    assert g.argv() == ["--max-model-len", "2048"]


def test_boolean_and_negation():
    f = Flags.parse("--no-enforce-eager")
    assert not f.enabled("--enforce-eager")
    g = f.set("--enforce-eager")
    assert g.argv() == ["--enforce-eager"] and g.enabled("--enforce-eager")


def test_negative_number_is_a_value():
    f = Flags.parse("--max-model-len -1")
    assert f.get("--max-model-len") == "-1"


def test_remove_and_diff():
    a = Flags.parse("--port 8000 --max-model-len 8192")
    b = a.remove("--port").set("--kv-cache-dtype", "fp8")
    assert diff(a, b) == {"--kv-cache-dtype": (None, "fp8"), "--port": ("8000", None)}


def test_parse_int_human_readable():
    assert parse_int("32k") == 32000
    assert parse_int("32K") == 32768
    assert parse_int("auto") is None and parse_int("-1") is None
    assert parse_int("garbage") is None


def test_removed_flags_by_version():
    from supervisor.core.vllm import removed_flag

    assert removed_flag("--swap-space", (0, 17, 0)) is None
    assert "0.18.0" in removed_flag("--swap_space", (0, 18, 0))
    assert removed_flag("--max-model-len", (0, 33, 0)) is None
    assert removed_flag("--swap-space", None) is None


def test_flags_over_a_config_file_layer():
    from supervisor.core.flags import Flags

    base = Flags.parse(["--max-model-len", "32768", "--enforce-eager", "--port", "9000"])
    f = Flags.parse(["--config", "v.yaml", "--max-model-len", "16384"], base=base)
    assert f.get("--max-model-len") == "16384"          # the command line wins over the file
    assert f.get("--port") == "9000" and f.enabled("--enforce-eager") and f.has("--port")
    assert f.argv() == ["--config", "v.yaml", "--max-model-len", "16384"]      # vLLM reads the file itself
    changed = f.set("--port", 9001).remove("--max-model-len")
    assert changed.get("--port") == "9001" and changed.get("--max-model-len") == "32768"
    assert changed.argv() == ["--config", "v.yaml", "--port", "9001"]
    assert f.set("--no-enforce-eager").enabled("--enforce-eager") is False
    assert f.as_dict()["--port"] == "9000" and f != Flags.parse(f.argv())
