"""core/picture.py: one GPU's memory as segments that add up to the card."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.flags import Flags
from supervisor.core.picture import planned, printed
from supervisor.core.plan import Sizing
from supervisor.facts.model_files import load_model_info

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "Llama-3.1-8B-Instruct"


def test_the_plans_picture_of_llama_8b_on_an_l4_adds_up_to_the_card():
    sizing = Sizing(load_model_info(str(MODEL), online=False), vllm_version="0.32.0", device_name="NVIDIA L4",
                    compute_capability=(8, 9))
    pic = planned(sizing, Flags.parse(["--max-model-len", "8192"]), total_gib=23.55, free_gib=23.55)
    parts = dict(pic["segments"])
    assert abs(sum(parts.values()) - 23.55) <= 0.03                 # every GiB of the card is somewhere
    # 0.32's default share is 0.92: what is left unused is 8% of 23.55 GiB
    assert abs(parts["unused"] - 0.08 * 23.55) <= 0.03
    # the weights: 8.03 B parameters in bf16 (config.json), 14.96 GiB as vLLM loads them, within the plan's band
    assert abs(parts["weights"] - 14.96) / 14.96 < 0.01
    assert parts["kv_cache"] > 0 and {"activation", "non_torch"} <= set(parts)


def test_vllms_picture_is_its_own_two_figures_and_the_rest_of_the_share():
    pic = printed({"model_loading_gib": 14.96, "kv_available_gib": 3.0}, total_gib=20.0, utilization=0.9)
    # 20 x 0.9 = 18 GiB share; 18 - 14.96 - 3.0 = 0.04 GiB for activation, non-torch and graphs; 2 GiB unused
    assert [list(s) for s in pic["segments"]] == [["weights", 14.96], ["overhead", 0.04], ["kv_cache", 3.0],
                                                   ["unused", 2.0]]
    assert printed({"model_loading_gib": 14.96}, total_gib=20.0, utilization=0.9) is None   # not said yet
    assert printed({"model_loading_gib": 1.0, "kv_available_gib": 1.0}, total_gib=None, utilization=0.9) is None


def test_the_graphs_vllm_printed_are_their_own_segment_of_its_picture():
    """vLLM 0.6.4+ prints "Graph capturing finished in 12 secs, took 0.56 GiB" (capture_model): the page
    shows it apart from the activation and non-torch memory."""
    # 20 x 0.95 = 19 GiB share; 19 - 14.96 - 3.0 - 0.56 = 0.48 GiB activation and non-torch; 1 GiB unused
    pic = printed({"model_loading_gib": 14.96, "kv_available_gib": 3.0, "cudagraph_gib": 0.56}, total_gib=20.0,
                  utilization=0.95)
    assert [list(s) for s in pic["segments"]] == [["weights", 14.96], ["runtime", 0.48], ["cudagraph", 0.56],
                                                   ["kv_cache", 3.0], ["unused", 1.0]]
