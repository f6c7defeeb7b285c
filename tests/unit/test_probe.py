"""The health probe through httpx's MockTransport: what counts as healthy, and the endpoint fallbacks."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from supervisor.shell.probe import Prober, probe_host


def probe(handler, **kw):
    """Run one probe against ``handler`` (request -> response); return the result and the paths asked."""
    paths: list[str] = []

    def record(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return handler(request)

    async def main():
        p = Prober("127.0.0.1", 8000, "org/model", transport=httpx.MockTransport(record), **kw)
        try:
            return await p.probe(), p.endpoint
        finally:
            await p.aclose()

    result, endpoint = asyncio.run(main())
    return result, endpoint, paths


def ok(key: str = "choices") -> httpx.Response:
    return httpx.Response(200, json={key: [{"index": 0}]})


def test_a_chat_completion_with_a_choice_is_healthy():
    result, endpoint, paths = probe(lambda r: ok())
    assert result.ok and result.status == 200 and endpoint == "chat"
    assert paths == ["/v1/chat/completions"]


def test_the_probe_asks_for_one_token_of_the_served_model_with_the_api_key():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content), auth=request.headers.get("authorization"))
        return ok()

    assert probe(handler, api_key="sk-abc")[0].ok
    assert (seen["model"], seen["max_tokens"], seen["auth"]) == ("org/model", 1, "Bearer sk-abc")


@pytest.mark.parametrize("response,error", [
    (httpx.Response(200, json={"choices": []}), "200 without choices"),
    (httpx.Response(200, text="not json"), "200 without choices"),
    (httpx.Response(500, text="engine dead"), "HTTP 500: engine dead"),
    (httpx.Response(503, text="loading"), "HTTP 503"),
])
def test_anything_but_a_real_answer_is_not_healthy(response, error):
    result, _, _ = probe(lambda r: response)
    assert not result.ok and error in result.error


def test_a_model_without_a_chat_template_falls_back_to_completions():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(400, json={"message": "this model has no chat template"})
        return ok()

    result, endpoint, paths = probe(handler)
    assert result.ok and endpoint == "completions"
    assert paths == ["/v1/chat/completions", "/v1/completions"]


def test_a_pooling_model_falls_back_to_embeddings():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/embeddings":
            return ok("data")
        return httpx.Response(400, json={"message": "The model does not support Chat Completions API"})

    result, endpoint, _ = probe(handler)
    assert result.ok and endpoint == "embeddings"


def test_connection_refused_means_still_loading():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    result, _, _ = probe(refuse)
    assert not result.ok and result.refused


def test_a_probe_that_times_out_says_so():
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    result, _, _ = probe(slow, timeout=0.5)
    assert not result.ok and not result.refused and "no answer in 0.5 s" in result.error


@pytest.mark.parametrize("host,expected", [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "[::1]"),
                                           ("fe80::1", "[fe80::1]"), ("10.1.2.3", "10.1.2.3")])
def test_where_a_server_bound_to_an_address_is_reached(host, expected):
    assert probe_host(host) == expected
