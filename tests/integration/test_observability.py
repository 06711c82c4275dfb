"""Prometheus metrics, /health, the gRPC health service and reflection on a real master."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from mooncake_py import ReplicateConfig
from mooncake_py.testing import InProcessMaster


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_follow_the_store(master: InProcessMaster, make_store) -> None:  # type: ignore[no-untyped-def]
    port = master.metrics_port
    store = make_store(master.address, 8 << 20)
    assert (
        store.put_batch(
            ["a", "b"], [b"1" * 100, b"2" * 100], ReplicateConfig(kv_sessions=[["s"], ["s"]])
        )
        == 0
    )
    store.pin_kv_session("s")
    assert store.get("a") == b"1" * 100
    assert store.remove("missing") == -704
    metrics = _scrape(port)
    assert metrics["master_key_count"] == 2
    assert metrics["master_total_capacity_bytes"] == 8 << 20
    assert metrics["master_allocated_bytes"] >= 200
    assert metrics["master_active_clients"] >= 1
    assert metrics["master_kv_sessions"] == 1 and metrics["master_kv_pinned_sessions"] == 1
    assert metrics["master_kv_session_memberships"] == 2
    assert metrics["master_batch_put_start_with_kv_sessions_requests_total"] == 1
    assert metrics["master_get_replica_list_requests_total"] >= 1
    assert metrics["master_remove_failures_total"] == 1
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
        assert json.loads(reply.read())["status"] == "ok"


def test_get_all_segments_lists_each_mounted_segment_name(
    master: InProcessMaster, make_store
) -> None:  # type: ignore[no-untyped-def]
    port = master.metrics_port
    url = f"http://127.0.0.1:{port}/get_all_segments"
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.status == 200 and reply.read() == b""
    stores = [make_store(master.address, 4 << 20) for _ in range(2)]
    with urllib.request.urlopen(url, timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    assert sorted(lines) == sorted(s.get_hostname() for s in stores)
    stores[0].close()
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.read().decode().splitlines() == [stores[1].get_hostname()]


def test_grpc_health_and_reflection(master: InProcessMaster) -> None:
    channel = grpc.insecure_channel(master.address)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "mooncake_py.v1.MasterService"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    answer = next(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in answer.list_services_response.service}
    assert "mooncake_py.v1.MasterService" in names and "grpc.health.v1.Health" in names
    channel.close()


def test_metrics_endpoint_serves_concurrent_scrapes_and_closes_with_the_master() -> None:
    master = InProcessMaster().start()
    port = master.metrics_port
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            scrapes = list(pool.map(lambda _: _scrape(port), range(16)))
        assert all(metrics["master_key_count"] == 0 for metrics in scrapes)
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nowhere", timeout=5)
        assert missing.value.code == 404
    finally:
        master.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
