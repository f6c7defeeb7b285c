"""What the guard tells about each event, asserted on the events themselves: structlog's captured
log entries, the history file, the metrics and the webhook's payloads (through MockTransport)."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import tenacity
from structlog.testing import capture_logs

from supervisor.config import GuardConfig
from supervisor.core.diagnosis import Diagnosis, Kind
from supervisor.core.flags import Flags
from supervisor.core.remedy import Change
from supervisor.core.session import DIED, FAILED, End, Facts, Launch, Outcome, Session
from supervisor.errors import EX_TEMPFAIL
from supervisor.shell import history
from supervisor.shell.report import Report, context_text
from supervisor.shell.webhook import Webhook

KV_LINE = ("ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache "
           "is needed, which is larger than the available KV cache memory (5.08 GiB). Based on the available "
           "memory, the estimated maximum model length is 41568.")


def told(tmp_path, events):
    """Run ``events(report)`` with a recording webhook; return (log entries, webhook bodies, report)."""
    bodies: list[dict] = []

    def record(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(204)

    async def main() -> tuple[list[dict], Report]:
        hook = Webhook("http://hooks.example/x", model="org/m", transport=httpx.MockTransport(record),
                       wait=tenacity.wait_none())
        report = Report(GuardConfig(model="org/m"), str(tmp_path), webhook=hook)
        with capture_logs() as logs:
            events(report)
        await hook.aclose()
        return logs, report

    logs, report = asyncio.run(main())
    return logs, bodies, report


def metric(report: Report, name: str) -> str:
    text = report.metrics.render()[0].decode()
    return "\n".join(line for line in text.splitlines() if line.startswith(name))


def test_a_failed_launch_is_one_event_everywhere(tmp_path):
    failed = Outcome(FAILED, Diagnosis(Kind.KV_CACHE_INSUFFICIENT, KV_LINE, {"fit_max_model_len": 41568},
                                       phase="kv_cache"), exit_code=1)

    def events(r: Report) -> None:
        r.launching(1, ["vllm", "serve", "org/m", "--api-key", "sekrit-key-123"], {})
        r.ended(failed, {"kv_available_gib": 5.08})

    logs, bodies, report = told(tmp_path, events)
    started, ended = logs
    assert started["log_level"] == "info" and started["launch"] == 1 and "sekrit" not in started["event"]
    assert ended["log_level"] == "warning" and ended["kind"] == "kv_cache_insufficient"
    assert ended["event"].startswith("launch 1 failed: kv_cache_insufficient: ValueError: To serve")
    assert ended["exit"] == "vLLM exited with code 1"
    (record,) = history.read(str(tmp_path))
    assert record["outcome"] == "failed" and record["evidence"] == KV_LINE
    assert record["measured"]["kv_available_gib"] == 5.08
    assert [b["event"] for b in bodies] == ["launch_failed"] and bodies[0]["kind"] == "kv_cache_insufficient"
    assert 'outcome="failed"' in metric(report, "vllm_guard_launches_total")


def test_a_death_while_serving_is_told_as_died(tmp_path):
    died = Outcome(DIED, Diagnosis(Kind.ENGINE_DEAD, "vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
                                   "encountered an issue.", phase="serving"), True, 3600.0, exit_code=-9)

    def events(r: Report) -> None:
        r.launching(1, ["vllm", "serve", "org/m"], {})
        r.ended(died, {})

    logs, bodies, _ = told(tmp_path, events)
    assert logs[-1]["event"].startswith("launch 1 died: engine_dead") and "SIGKILL" in logs[-1]["exit"]
    assert bodies[0]["event"] == "died" and bodies[0]["exit_code"] == -9


def test_a_relaunch_says_each_change_and_why_and_is_counted_by_the_kind_it_heals(tmp_path):
    step = Launch(Flags.parse("--max-model-len 41568"),
                  (Change("--max-model-len", None, "41568", "vLLM estimates 41568 tokens fit"),),
                  "vLLM estimates 41568 tokens fit", reason="kv_cache_insufficient")
    logs, bodies, report = told(tmp_path, lambda r: r.relaunch(2, step))
    (entry,) = logs
    assert entry == {"event": "relaunch 2: --max-model-len (unset) -> 41568 because vLLM estimates 41568 tokens fit",
                     "launch": 2, "kind": "kv_cache_insufficient", "changed": ["--max-model-len"],
                     "backoff_s": 0.0, "log_level": "warning"}
    assert bodies[0]["changes"] == [{"flag": "--max-model-len", "was": None, "now": "41568",
                                     "why": "vLLM estimates 41568 tokens fit"}]
    assert 'vllm_guard_relaunches_total{reason="kv_cache_insufficient"} 1.0' in metric(report, "vllm_guard_relaunches")


def test_a_relaunch_after_a_backoff_says_how_long_it_waited(tmp_path):
    same = Launch(Flags.parse("--max-model-len 41568"), (), "the engine died while serving", delay=4.06,
                  reason="engine_dead")
    logs, bodies, _ = told(tmp_path, lambda r: r.relaunch(3, same))
    (entry,) = logs
    assert entry["event"] == "relaunch 3 with the same flags after a 4.1 s backoff: the engine died while serving"
    assert entry["backoff_s"] == 4.1 and bodies[0]["delay_s"] == 4.1


def test_giving_up_is_one_sentence_with_who_holds_the_gpu(tmp_path):
    end = End(EX_TEMPFAIL, "the model's weights do not fit in GPU memory.", "more GPUs.", Kind.OOM_WEIGHTS)
    msg = None

    def events(r: Report) -> None:
        nonlocal msg
        msg = r.gave_up(end, "pid 4242 python (10.0 GiB)")

    logs, bodies, report = told(tmp_path, events)
    assert msg == ("giving up: the model's weights do not fit in GPU memory. What could help: more GPUs. "
                   "GPU memory is held by: pid 4242 python (10.0 GiB).")
    assert logs == [{"event": msg, "exit_code": EX_TEMPFAIL, "kind": "oom_weights", "log_level": "error"}]
    assert bodies[0]["event"] == "gave_up" and bodies[0]["exit_code"] == EX_TEMPFAIL
    assert report.history.last_gave_up() is not None
    assert float(metric(report, "vllm_guard_gave_up_timestamp_seconds ").split()[1]) > 0


def test_healthy_reports_the_context_served_of_what_fit(tmp_path):
    cfg = GuardConfig(model="org/m", vllm_args=("--max-model-len", "32768"))
    session = Session(cfg, Facts(vllm_version="0.32.0"), rng=random.Random(0))
    session.first_launch()
    session.launching()

    def events(r: Report) -> None:
        r.launching(1, cfg.launch_argv(session.current), {})
        r.healthy(session, 42.0, {"kv_cache_tokens": 41584})

    logs, bodies, report = told(tmp_path, events)
    assert logs[-1]["time_to_healthy_s"] == 42.0 and logs[-1]["event"].startswith("healthy: a chat completion")
    assert bodies[-1]["event"] == "healthy" and bodies[-1]["context"] == {"served": 32768, "requested": 32768,
                                                                           "fit": 41568}
    doc = report.status(session, pid=None, gpus=[], exit_reason="")
    assert doc["context"]["text"] == "context served 32768 of 41568 that fit"
    assert 'vllm_guard_context_fit_tokens 41568.0' in metric(report, "vllm_guard_context_fit_tokens")


def test_context_text_names_a_cut():
    assert context_text({"served": 29936, "requested": 131072, "fit": 29952})["text"] == (
        "context served 29936 of 29952 that fit (131072 asked)")
    assert context_text({"served": None, "requested": None, "fit": None})["text"] == "context served: vLLM's default"


def test_an_exit_the_guard_caused_is_not_told_as_vllms_own(tmp_path):
    """vLLM's API server exits by SIGINT when the guard stops it after a fatal line (real 0.32)."""
    stopped = Outcome(FAILED, Diagnosis(Kind.KV_CACHE_INSUFFICIENT, KV_LINE, phase="kv_cache"), exit_code=-2,
                      stopped=True)

    def events(r: Report) -> None:
        r.launching(1, ["vllm", "serve", "org/m"], {})
        r.ended(stopped, {})

    logs, _, report = told(tmp_path, events)
    assert logs[-1]["exit"] == "stopped by the guard (vLLM was killed by SIGINT)"
    assert report.history.records[0]["exit"] == "stopped by the guard (vLLM was killed by SIGINT)"


def test_status_names_the_phase_the_url_the_last_failure_healed_and_the_memory_vllm_printed(tmp_path):
    from supervisor.core.gpus import GpuDevice
    from supervisor.core.progress import Progress

    GiB = 1 << 30
    cfg = GuardConfig(model="org/m")
    l4 = GpuDevice(0, "NVIDIA L4", int(23.55 * GiB), 0, int(23.55 * GiB), (8, 9), ())
    session = Session(cfg, Facts(vllm_version="0.32.0", devices=(l4,), total_gib=23.55, free_gib=23.55),
                      rng=random.Random(0))
    session.first_launch()
    session.launching()
    failed = Outcome(FAILED, Diagnosis(Kind.KV_CACHE_INSUFFICIENT, KV_LINE, {"fit_max_model_len": 41568},
                                       phase="kv_cache"), exit_code=1)
    printed = {"model_loading_gib": 14.96, "kv_available_gib": 5.08}

    def events(r: Report) -> None:
        r.launching(1, cfg.launch_argv(session.current), {})
        r.ended(failed, {})
        r.launching(2, cfg.launch_argv(session.current), {})
        r.progress = Progress(2, started_at=1000.0)
        r.progress.line("Loading safetensors checkpoint shards:  40% Completed | 2/5", "loading")
        r.vllm_lines([b"Loading safetensors checkpoint shards:  40% Completed | 2/5"])

    _, _, report = told(tmp_path, events)
    doc = report.status(session, pid=None, gpus=[], exit_reason="", numbers=printed)
    assert doc["vllm"]["url"] == "http://127.0.0.1:8000"
    assert doc["progress"]["text"] == "loading weights 40%" and doc["progress"]["launch"] == 2
    assert doc["last_failure"]["kind"] == "kv_cache_insufficient" and doc["last_failure"]["healed"] is False
    assert doc["summary"].startswith("starting: launch 2, loading weights 40%, ")
    assert doc["summary"].endswith("; vLLM on http://127.0.0.1:8000; last failure kv_cache_insufficient (launch 1)")
    assert doc["recent_output"] == ["Loading safetensors checkpoint shards:  40% Completed | 2/5"]
    # vLLM's own figures: 23.55 GiB x 0.92 (0.32's default share) = 21.67; less weights and KV cache = 1.63
    assert [list(seg) for seg in doc["memory"]["vllm"]["segments"]] == [
        ["weights", 14.96], ["overhead", 1.63], ["kv_cache", 5.08], ["unused", 1.88]]
    assert doc["memory"]["plan"] is None                 # no model config: nothing to plan from
