"""The Kubernetes manifests, checked offline: the OpenAPI schema, and what the guard relies on.

Every manifest (and each kustomization as rendered) validates against the Kubernetes schema of
several versions (kubernetes-validate, strict: unknown fields are errors). The container's
arguments go through the real `vllm-guard start` parser and config resolution with the image's
ENV and the container's env, and the result is checked against the probes, ports, volumes,
Secret and termination grace. The kustomizations are rendered here by a small renderer that
supports exactly what they use; where kubectl is installed its `kubectl kustomize` must agree.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from supervisor import config
from supervisor.core.flags import Flags
from supervisor.shell import auth, signalling

yaml = pytest.importorskip("yaml")
dockerfile_parse = pytest.importorskip("dockerfile_parse")

ROOT = Path(__file__).resolve().parents[2]
KDIR = ROOT / "configs" / "kubernetes"
VARIANTS = {"base": KDIR, "tp2": KDIR / "overlays" / "tp2"}
SECRET_EXAMPLE = KDIR / "secret.example.yaml"
PODMONITOR = KDIR / "optional" / "podmonitor.yaml"
CONTAINER = "vllm-guard"
K8S_VERSIONS = ["1.29.0", "1.33.0", "latest"]


# -- loading and rendering ---------------------------------------------------------------------------

def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


# Strategic-merge keys of the lists the patches touch (from the Kubernetes API's
# x-kubernetes-patch-merge-key); any other list is replaced whole, as Kubernetes does.
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
               "volumeMounts": "mountPath", "ports": "containerPort", "imagePullSecrets": "name"}


def strategic_merge(base: Any, patch: Any, field: str | None = None) -> Any:
    """Kustomize's strategic merge for plain patches (no $patch directives): maps merge,
    keyed lists merge by key (patched items first, as kustomize orders them), others replace."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            out[key] = strategic_merge(base[key], value, key) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list) and field in _MERGE_KEYS:
        key = _MERGE_KEYS[field]
        by_key = {item[key]: item for item in base}
        merged = [strategic_merge(by_key[p[key]], p) if p[key] in by_key else copy.deepcopy(p) for p in patch]
        patched = {p[key] for p in patch}
        return merged + [copy.deepcopy(b) for b in base if b[key] not in patched]
    return copy.deepcopy(patch)


def _same_object(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["apiVersion"], a["kind"], a["metadata"]["name"]) == (b["apiVersion"], b["kind"], b["metadata"]["name"])


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """Render a kustomization that uses only resources, patches (by path) and images."""
    spec = load_docs(directory / "kustomization.yaml")[0]
    assert spec["kind"] == "Kustomization"
    unsupported = set(spec) - {"apiVersion", "kind", "resources", "patches", "images"}
    assert not unsupported, f"the test's renderer does not know {unsupported}; extend it"
    objects: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        objects += kustomize(path) if path.is_dir() else load_docs(path)
    for entry in spec.get("patches", []):
        assert set(entry) == {"path"}, f"only `patches: - path:` is supported: {entry}"
        for patch in load_docs(directory / entry["path"]):
            targets = [i for i, o in enumerate(objects) if _same_object(o, patch)]
            assert len(targets) == 1, f"patch {entry['path']} matches {len(targets)} objects"
            objects[targets[0]] = strategic_merge(objects[targets[0]], patch)
    for image in spec.get("images", []):
        for obj in objects:
            for c in pod_spec(obj).get("containers", []) if obj["kind"] in WORKLOADS else []:
                name, _, tag = c["image"].partition(":")
                if name == image["name"]:
                    c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
    return objects


WORKLOADS = ("StatefulSet", "Deployment")


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def rendered(variant: str) -> list[dict[str, Any]]:
    return kustomize(VARIANTS[variant])


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    ss = one(objects, "StatefulSet")
    return next(c for c in pod_spec(ss)["containers"] if c["name"] == CONTAINER)


def container_port(c: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port (a number or a port name) as the container's port number."""
    numbers = {p["containerPort"] for p in c["ports"]}
    if isinstance(port, int):
        assert port in numbers, f"port {port} is not a container port ({numbers})"
        return port
    named = {p["name"]: p["containerPort"] for p in c["ports"] if "name" in p}
    assert port in named, f"no container port named {port!r} ({sorted(named)})"
    return named[port]


# -- what the container runs ------------------------------------------------------------------------

def image_facts() -> tuple[list[str], dict[str, str]]:
    """The image's ENTRYPOINT after `vllm-guard serve`, and its ENV."""
    parser = dockerfile_parse.DockerfileParser(path=str(ROOT / "Dockerfile"))
    entry = json.loads(next(s["value"] for s in parser.structure if s["instruction"] == "ENTRYPOINT"))
    return entry[entry.index("serve") + 1:], dict(parser.envs)


def serve_args(argv: list[str]) -> argparse.Namespace:
    """What `vllm-guard serve ARGV` resolves its config from: every argument is vLLM's."""
    return argparse.Namespace(vllm_args=list(argv))


SECRET_STANDIN = "value-from-the-secret"


def container_environ(c: dict[str, Any], home: Path) -> dict[str, str]:
    """The environment the guard sees: image ENV < the container's env (secrets as stand-ins)."""
    _prefix, env = image_facts()
    env = {**env, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config")}
    for item in c.get("env", []):
        env[item["name"]] = item["value"] if "value" in item else SECRET_STANDIN
    return env


def guard_config(c: dict[str, Any], home: Path, extra_env: dict[str, str] | None = None) -> config.GuardConfig:
    """What `vllm-guard serve` resolves in this container: ENTRYPOINT + command/args, ENV + env."""
    prefix, _env = image_facts()
    if "command" in c:  # a command replaces the ENTRYPOINT; it must still run `vllm-guard serve`
        assert "serve" in c["command"], c["command"]
        prefix = c["command"][c["command"].index("serve") + 1:]
    args = serve_args(prefix + list(c.get("args", [])))
    return config.resolve(args, {**container_environ(c, home), **(extra_env or {})})


@pytest.fixture(params=sorted(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return request.param


# -- schema ---------------------------------------------------------------------------------------------

def all_manifests() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object: each YAML file as written, and each kustomization as rendered."""
    out: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(KDIR.rglob("*.yaml")):
        for doc in load_docs(path):
            group = doc.get("apiVersion", "").split("/")[0]
            if doc.get("kind") == "Kustomization" or group.endswith(".coreos.com"):
                continue  # not core API kinds: kustomize's own file, the Prometheus Operator's CRD
            if path.parent.name == "tp2" and path.name != "kustomization.yaml":
                continue  # a partial patch: validated below as rendered
            out.append((str(path.relative_to(ROOT)), doc))
    for name in VARIANTS:
        out += [(f"kustomize {name}: {o['kind']}/{o['metadata']['name']}", o) for o in rendered(name)]
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schema(version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    if version == "latest":
        version = kubernetes_validate.latest_version()
    manifests = all_manifests()
    assert len(manifests) >= 7
    for where, obj in manifests:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where} is not a valid {obj['kind']} for Kubernetes {version}: {exc.message}")


def test_the_schema_check_catches_a_misspelled_field() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    ss = copy.deepcopy(one(rendered("base"), "StatefulSet"))
    next(c for c in pod_spec(ss)["containers"])["readinessProbe"]["httpGet"]["pth"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError, match="pth"):
        kubernetes_validate.validate(ss, kubernetes_validate.latest_version(), strict=True)


def test_kustomizations_list_every_manifest_but_the_secret_example() -> None:
    base = KDIR / "base"
    listed = {(base / r).resolve() for r in load_docs(base / "kustomization.yaml")[0]["resources"]}
    manifests = {p.resolve() for p in base.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == manifests
    for name in VARIANTS:  # a placeholder Secret applied with the rest would overwrite the real one
        assert not [o for o in rendered(name) if o["kind"] == "Secret"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_renderer_agrees_with_kubectl_kustomize(name: str) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(VARIANTS[name])], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731 - a sort key
    assert sorted(load_docs_text(out.stdout), key=key) == sorted(rendered(name), key=key)


def load_docs_text(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


# -- the guard's contract -------------------------------------------------------------------------------

def test_container_args_are_accepted_by_vllm_guard_start(variant: str, tmp_path: Path) -> None:
    objects = rendered(variant)
    c = container(objects)
    cfg = guard_config(c, tmp_path)
    assert cfg.model and "/" in cfg.model
    assert "--" not in cfg.vllm_args
    flags = Flags.parse(list(cfg.vllm_args))
    assert flags.has("--max-model-len")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": cfg.port, "status": cfg.status.port}
    assert cfg.host == "0.0.0.0"  # vLLM must answer on the pod IP, not only inside the pod
    assert not auth.is_loopback(cfg.status.host)  # the kubelet probes the pod IP


def test_probes_ask_the_guard_on_its_status_port(variant: str, tmp_path: Path) -> None:
    c = container(rendered(variant))
    cfg = guard_config(c, tmp_path)
    paths = {}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c[probe]["httpGet"]
        assert container_port(c, get["port"]) == cfg.status.port, f"{probe} must ask the guard, not vLLM"
        paths[probe] = get["path"]
    assert paths == {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/ready"}


def budget(probe: dict[str, Any]) -> int:
    """Seconds of failures before the kubelet acts (the probe defaults are period 10, threshold 3)."""
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def test_probe_timing_leaves_the_model_load_to_the_guard(variant: str, tmp_path: Path) -> None:
    c = container(rendered(variant))
    cfg = guard_config(c, tmp_path)
    # The guard opens its endpoint seconds after start (orphan sweep included: <= 10 s grace +
    # 5 s kill wait); the startup probe allows minutes, but covers no part of the load.
    assert 120 <= budget(c["startupProbe"]) < cfg.startup_timeout
    # A stuck guard is restarted within a minute; a slow probe is not a dead guard.
    assert 20 <= budget(c["livenessProbe"]) <= 60
    assert c["livenessProbe"]["timeoutSeconds"] >= 3
    # Readiness flips fast both ways: it only reads the guard's state.
    assert budget(c["readinessProbe"]) <= 15


def test_tokens_come_from_the_secret(variant: str, tmp_path: Path) -> None:
    c = container(rendered(variant))
    env = {e["name"]: e for e in c["env"]}
    secret = load_docs(SECRET_EXAMPLE)[0]
    for name, key in (("VLLM_GUARD_TOKEN", "guard-token"), ("HF_TOKEN", "hf-token")):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], key)
        assert key in secret["stringData"]
    assert env["VLLM_GUARD_TOKEN"]["valueFrom"]["secretKeyRef"].get("optional") is not True
    plain_secrets = [e["name"] for e in c["env"] if "value" in e and auth.is_secret_name(e["name"])]
    assert not plain_secrets, f"secret-looking variables with inline values: {plain_secrets}"
    secret_args = auth.argv_secrets(c.get("args", []))
    assert not secret_args, "a secret in args shows in `kubectl get -o yaml`; use env from the Secret"
    # The status endpoint on the pod IP with that token: the guard's own bind check passes.
    environ = container_environ(c, tmp_path)
    token, generated, explicit = auth.resolve_token(str(tmp_path / "state"), "", environ)
    assert explicit and generated is None
    auth.check_bind(guard_config(c, tmp_path).status.host, explicit, token)


def test_the_secret_example_holds_only_placeholders() -> None:
    secret = load_docs(SECRET_EXAMPLE)[0]
    assert secret["kind"] == "Secret" and "data" not in secret
    for key, value in secret["stringData"].items():
        assert value.startswith("REPLACE-ME"), f"{key} does not look like a placeholder"
        assert auth.redact_text(value) == value, f"{key} has the shape of a real token"
    assert "placeholder" in SECRET_EXAMPLE.read_text().lower()


def test_gpus_match_the_parallelism(variant: str, tmp_path: Path) -> None:
    c = container(rendered(variant))
    flags = Flags.parse(list(guard_config(c, tmp_path).vllm_args))
    needed = (flags.get_int("--tensor-parallel-size") or 1) * (flags.get_int("--pipeline-parallel-size") or 1)
    limits, requests = c["resources"]["limits"], c["resources"]["requests"]
    assert int(limits["nvidia.com/gpu"]) == needed
    assert int(requests.get("nvidia.com/gpu", limits["nvidia.com/gpu"])) == needed  # extended: equal
    assert (variant == "tp2") == (needed == 2)


def test_state_and_model_cache_live_on_claims(variant: str, tmp_path: Path) -> None:
    objects = rendered(variant)
    ss, c = one(objects, "StatefulSet"), container(objects)
    cfg = guard_config(c, tmp_path)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    claims = {t["metadata"]["name"] for t in ss["spec"]["volumeClaimTemplates"]}
    assert mounts[cfg.state_dir] in claims, "learned flags must survive the pod"
    hf_home = container_environ(c, tmp_path)["HF_HOME"]
    assert mounts[hf_home] in claims, "weights must not be downloaded again on every restart"
    assert ss["spec"]["replicas"] == 1 or ss["spec"]["podManagementPolicy"] == "Parallel"


def test_shared_memory_is_a_memory_backed_emptydir(variant: str) -> None:
    objects = rendered(variant)
    ss, c = one(objects, "StatefulSet"), container(objects)
    shm = next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod_spec(ss)["volumes"] if v["name"] == shm)
    assert volume["emptyDir"]["medium"] == "Memory"
    assert gib(volume["emptyDir"]["sizeLimit"]) < gib(c["resources"]["limits"]["memory"])  # tmpfs counts


def gib(quantity: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024, "Ti": 1024.0}
    return float(quantity[:-2]) * units[quantity[-2:]]


def test_termination_grace_outlasts_the_guard_stop(variant: str, tmp_path: Path) -> None:
    objects = rendered(variant)
    ss, c = one(objects, "StatefulSet"), container(objects)
    cfg = guard_config(c, tmp_path)
    # SIGTERM -> the guard -> vLLM's group; SIGKILL after stop_grace; reaping; the guard's exit.
    needed = cfg.stop_grace + signalling.KILL_WAIT + 10
    assert pod_spec(ss)["terminationGracePeriodSeconds"] >= needed


def test_services_route_to_the_named_ports(variant: str) -> None:
    objects = rendered(variant)
    ss, c = one(objects, "StatefulSet"), container(objects)
    labels = ss["spec"]["template"]["metadata"]["labels"]
    assert ss["spec"]["selector"]["matchLabels"].items() <= labels.items()
    api = one(objects, "Service", "vllm-guard-api")
    pods = one(objects, "Service", ss["spec"]["serviceName"])
    for svc in (api, pods):
        assert svc["spec"]["selector"].items() <= labels.items()
        for port in svc["spec"]["ports"]:
            container_port(c, port["targetPort"])
    status = container_port(c, "status")
    assert all(container_port(c, p["targetPort"]) != status for p in api["spec"]["ports"]), \
        "the guard's status endpoint stays off the client-facing Service"
    assert pods["spec"]["clusterIP"] == "None"
    assert pods["spec"]["publishNotReadyAddresses"] is True  # /status and /restart of an unready pod
    assert status in {container_port(c, p["targetPort"]) for p in pods["spec"]["ports"]}


def test_prometheus_scrapes_the_guard_per_pod_and_vllm_per_service(variant: str) -> None:
    objects = rendered(variant)
    ss, c = one(objects, "StatefulSet"), container(objects)
    pod = ss["spec"]["template"]["metadata"]["annotations"]
    assert pod["prometheus.io/scrape"] == "true" and pod["prometheus.io/path"] == "/metrics"
    assert int(pod["prometheus.io/port"]) == container_port(c, "status")
    svc = one(objects, "Service", "vllm-guard-api")["metadata"]["annotations"]
    assert svc["prometheus.io/scrape"] == "true" and svc["prometheus.io/path"] == "/metrics"
    assert int(svc["prometheus.io/port"]) == container_port(c, "http")


def service_link_env(service: dict[str, Any]) -> dict[str, str]:
    """The variables the kubelet injects for a Service when service links are on."""
    name = service["metadata"]["name"].upper().replace("-", "_")
    ip, env = "10.96.0.10", {}
    ports = service["spec"]["ports"]
    env[f"{name}_SERVICE_HOST"], env[f"{name}_SERVICE_PORT"] = ip, str(ports[0]["port"])
    env[f"{name}_PORT"] = f"tcp://{ip}:{ports[0]['port']}"
    for p in ports:
        base = f"{name}_PORT_{p['port']}_TCP"
        env[base] = f"tcp://{ip}:{p['port']}"
        env.update({f"{base}_PROTO": "tcp", f"{base}_PORT": str(p["port"]), f"{base}_ADDR": ip})
        if "name" in p:
            env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
    return env


def test_service_links_cannot_turn_into_settings(variant: str, tmp_path: Path) -> None:
    objects = rendered(variant)
    ss, c = one(objects, "StatefulSet"), container(objects)
    assert pod_spec(ss)["enableServiceLinks"] is False
    # Even with links on (the namespace's other Services are not ours to name), ours must not
    # collide: `vllm` would set VLLM_PORT for vLLM, `vllm-guard` VLLM_GUARD_PORT for the guard.
    links: dict[str, str] = {}
    for svc in (o for o in objects if o["kind"] == "Service"):
        links.update(service_link_env(svc))
    settings = {config.env_name(key) for key in config.SPECS} | {"VLLM_PORT", "VLLM_HOST_IP"}
    assert not settings & set(links), sorted(settings & set(links))
    assert guard_config(c, tmp_path, links) == guard_config(c, tmp_path)


def test_service_link_collision_is_detected_for_a_service_named_vllm_guard() -> None:
    svc = {"metadata": {"name": "vllm-guard"}, "spec": {"ports": [{"name": "http", "port": 8000}]}}
    links = service_link_env(svc)
    assert links["VLLM_GUARD_PORT"] == "tcp://10.96.0.10:8000"
    with pytest.raises(config.ConfigError, match="VLLM_GUARD_PORT"):
        config.resolve(argparse.Namespace(model="org/model"), links)


def test_the_podmonitor_scrapes_both_metrics_ports() -> None:
    monitor = load_docs(PODMONITOR)[0]
    c = container(rendered("base"))
    labels = one(rendered("base"), "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {container_port(c, e["port"]) for e in endpoints} == {8000, 8077}
    assert all(e["path"] == "/metrics" for e in endpoints)
