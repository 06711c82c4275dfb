"""Deployment files name only commands, flags, ports, config keys and env vars that exist."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import yaml

from mooncake_py.client.config import ClientConfig
from mooncake_py.master.config import (
    MasterConfig,
    build_arg_parser,
    config_from_mapping,
    load_config_file,
)

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
MASTER_KEYS = {f.name for f in dataclasses.fields(MasterConfig)}
CLIENT_KEYS = {f.name for f in dataclasses.fields(ClientConfig)} | {"master_server_address"}
MASTER_FLAGS = {
    option for action in build_arg_parser()._actions for option in action.option_strings
}
COMMANDS = {
    "mooncake-py-master",
    "mooncake-py",
    "mooncake-py-segment-host",
    "python -m mooncake_py.master",
}
CLIENT_ENV = {
    "MOONCAKE_MASTER",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_TENANT_ID",
    "MOONCAKE_CONFIG_PATH",
    "MOONCAKE_AUTH_TOKEN",
    "MOONCAKE_PY_FORCE_TCP",
    "MOONCAKE_PY_MASTER_TRANSPORT",
    "MOONCAKE_TE_META_DATA_SERVER",
}
DEPLOYED = config_from_mapping(load_config_file(str(DEPLOY / "master.yaml")))
PORTS = {DEPLOYED.port, DEPLOYED.fast_rpc_port, DEPLOYED.metrics_port}


def _check_command(argv: list[str]) -> None:
    text = " ".join(argv)
    assert any(text.startswith(c) for c in COMMANDS), f"unknown command {text!r}"
    if argv[0] == "mooncake-py-master":
        for arg in argv[1:]:
            if arg.startswith("--"):
                assert arg.split("=")[0] in MASTER_FLAGS, f"unknown master flag {arg!r}"


def _check_env(env: dict[str, Any] | list[dict[str, Any]]) -> None:
    names = [e["name"] for e in env] if isinstance(env, list) else list(env)
    for name in names:
        assert name in CLIENT_ENV, f"unknown environment variable {name!r}"


def test_master_configs_use_real_keys_and_the_example_lists_every_default() -> None:
    example = load_config_file(str(DEPLOY / "master.example.yaml"))
    assert set(example) == MASTER_KEYS, "the example must list every option"
    assert config_from_mapping(example) == MasterConfig()
    assert set(load_config_file(str(DEPLOY / "master.yaml"))) <= MASTER_KEYS


def test_client_config_uses_real_keys() -> None:
    values = json.loads((DEPLOY / "client.json").read_text())
    assert set(values) <= CLIENT_KEYS
    ClientConfig.from_mapping(values)


def test_dockerfile_and_compose() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", dockerfile, re.M).group(1))  # type: ignore[union-attr]
    _check_command(entry + cmd)
    exposed = {int(p) for p in re.search(r"^EXPOSE (.*)$", dockerfile, re.M).group(1).split()}  # type: ignore[union-attr]
    assert exposed == PORTS
    for source in re.findall(r"^COPY (\S+) ", dockerfile, re.M):
        assert (DEPLOY.parent / source).exists(), source

    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        entry = service.get("entrypoint", ["mooncake-py-master"])
        _check_command(entry + service.get("command", []))
        _check_env(service.get("environment", {}))
        for mapping in service.get("ports", []):
            assert int(mapping.rsplit(":", 1)[1]) in PORTS, (name, mapping)
        master = service.get("environment", {}).get("MOONCAKE_MASTER")
        if master:
            assert int(master.rsplit(":", 1)[1]) == DEPLOYED.port


def test_kubernetes_manifests() -> None:
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc["kind"] == "ConfigMap":
                for text in doc["data"].values():
                    assert set(yaml.safe_load(text)) <= MASTER_KEYS
                continue
            if doc["kind"] == "Service":
                assert {p["port"] for p in doc["spec"]["ports"]} <= PORTS
                continue
            for container in doc["spec"]["template"]["spec"]["containers"]:
                _check_command(container["command"] + container.get("args", []))
                _check_env(container.get("env", []))
                for port in container.get("ports", []):
                    assert port["containerPort"] in PORTS
                for probe in ("readinessProbe", "livenessProbe"):
                    if probe in container:
                        assert container[probe]["grpc"]["port"] == DEPLOYED.port


def test_systemd_units() -> None:
    for path in DEPLOY.glob("*.service"):
        text = path.read_text()
        exec_start = re.search(r"^ExecStart=(.*)$", text, re.M).group(1).split()  # type: ignore[union-attr]
        binary = Path(exec_start[0]).name
        argv = ["python" if binary == "python" else binary, *exec_start[1:]]
        _check_command(argv)
        for env in re.findall(r"^Environment=(\w+)=", text, re.M):
            assert env in CLIENT_ENV
