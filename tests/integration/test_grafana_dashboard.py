"""The Grafana dashboard (deploy/grafana/mooncake-py.json) names only metrics and labels a real
master exports.

Every panel's PromQL and every template variable's ``label_values(...)`` query is parsed with
``promql-parser``; each selected series name must be a sample name of a scrape of a real
master (so a counter must be named with its ``_total`` suffix, as Prometheus stores it), every
series inside ``rate()``-like calls must be a counter, and every label a query filters on,
groups by (``by``/``without``/``on``/``ignoring``/``group_left``), or shows in its legend
(``{{label}}``) must be carried by the series it applies to, or be one Prometheus adds when it
scrapes (``instance``, ``job``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest

from mooncake_py import MooncakeDistributedStore, ObjectDataType, ReplicateConfig
from mooncake_py.master.clock import FakeClock
from mooncake_py.testing import InProcessMaster
from tests.conftest import client_config
from tests.integration.disk_world import (
    disk_client_config,
    fill_until_spilled,
    payload,
    wait_until_settled,
)
from tests.integration.metrics_scrape import Scrape

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "mooncake-py.json"
TARGET_LABELS = {"instance", "job"}
"""Labels Prometheus attaches to every series it scrapes."""
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets"}
GRAFANA_INTERVALS = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__\w+)\}")
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<series>.+),\s*)?(?P<label>\w+)\)$")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


# --- reading the dashboard ---------------------------------------------------------------------


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, set[str]]]:
    """(where, PromQL, labels its result must carry) of every panel target (the labels its
    legend shows) and every template variable (``label_values(series, label)``: ``label``)."""
    found = []
    for panel in _panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            where = f"panel {panel['title']!r} target {target['refId']}"
            shown = set(LEGEND_LABEL.findall(target.get("legendFormat", "")))
            found.append((where, target["expr"], shown))
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        match = LABEL_VALUES.match(text.strip())
        assert match, f"variable {variable['name']}: not a label_values query: {text!r}"
        assert match["series"], f"variable {variable['name']}: names no series: {text!r}"
        found.append((f"variable {variable['name']!r}", match["series"], {match["label"]}))
    return found


def _selectors(expr: Any) -> list[Any]:
    selectors: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            selectors.append(node)

    promql_parser.walk(expr, visit)
    return selectors


def problems_of(dashboard: dict[str, Any], scrape: Scrape) -> list[str]:
    """Every name or label of the dashboard's queries that the scrape does not back."""
    kinds = {s.name: kind for s, kind in _sample_types(scrape)}
    labels = {name: scrape.label_names(name) | TARGET_LABELS for name in kinds}
    problems: list[str] = []

    def need_labels(where: str, wanted: set[str], selectors: list[Any], why: str) -> None:
        for selector in selectors:
            missing = wanted - labels.get(selector.name, TARGET_LABELS)
            if missing and selector.name in kinds:
                problems.append(f"{where}: {selector.name} has no label {sorted(missing)} ({why})")

    for where, text, shown in queries(dashboard):
        try:
            expr = promql_parser.parse(GRAFANA_INTERVALS.sub("5m", text))
        except ValueError as error:
            problems.append(f"{where}: not PromQL ({error}): {text}")
            continue
        selectors = _selectors(expr)
        if not selectors:
            problems.append(f"{where}: selects no series: {text}")
        for selector in selectors:
            if selector.name not in kinds:
                problems.append(f"{where}: {selector.name!r} is not exported")
            used = {m.name for m in selector.matchers.matchers if m.name != "__name__"}
            need_labels(where, used, [selector], "matcher")

        def visit(node: Any, where: str = where) -> None:
            if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
                need_labels(where, set(node.modifier.labels), _selectors(node.expr), "grouping")
            elif isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
                modifier = node.modifier
                matching = set(modifier.matching.labels) if modifier.matching else set()
                grouping = matching | set(modifier.group_labels or ())
                sides = _selectors(node.lhs) + _selectors(node.rhs)
                need_labels(where, grouping, sides, "vector matching")
            elif isinstance(node, promql_parser.Call) and node.func.name in COUNTER_FUNCTIONS:
                for selector in _selectors(node):
                    kind = kinds.get(selector.name)
                    if kind is not None and kind != "counter":
                        problems.append(f"{where}: {node.func.name}() of {selector.name}, a {kind}")

        promql_parser.walk(expr, visit)
        need_labels(where, shown, selectors, "legend or variable")
    return problems


# Sample name suffixes of families that only grow: a counter's ``_total``, a histogram's or a
# summary's ``_bucket``, ``_count`` and ``_sum`` (the parser names the family without them).
_MONOTONIC_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
}


def _sample_types(scrape: Scrape) -> Iterator[tuple[Any, str]]:
    """Each sample with ``counter`` when it only grows (what ``rate()`` may take), else its
    family's type (``gauge``, ...)."""
    for sample in scrape.samples:
        kind = scrape.families.get(sample.name, "untyped")
        for family_type, suffixes in _MONOTONIC_SUFFIXES.items():
            for suffix in suffixes:
                family = sample.name.removesuffix(suffix)
                if family != sample.name and scrape.families.get(family) == family_type:
                    kind = "counter"
        yield sample, kind


# --- a master that has done everything the dashboard shows -------------------------------------


@pytest.fixture(scope="module")
def busy_master_scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scrape]:
    """A scrape of a real master after puts, a hit, a miss, an ordinary and a soft-pinned
    eviction, and a release of every kind, by a real client; then spills to a second
    client's disk tier and a read of a spilled object."""
    clock = FakeClock()
    with InProcessMaster(clock=clock, background=False) as master:
        store = MooncakeDistributedStore()
        assert store.setup(client_config(master.address, 1 << 20)) == 0
        try:
            _exercise(store, clock)
        finally:
            store.close()
        disk_owner = MooncakeDistributedStore()
        root = str(tmp_path_factory.mktemp("disk"))
        assert disk_owner.setup(disk_client_config(master.address, root)) == 0
        try:
            fill_until_spilled(master, disk_owner, "spill", minimum=2)
            assert disk_owner.get("spill0") == payload(0)  # spilled first: read from disk
            wait_until_settled(master)
            scrape = Scrape(master)
            master.service.check()
        finally:
            disk_owner.close()
    yield scrape


def _exercise(store: MooncakeDistributedStore, clock: FakeClock) -> None:
    big = b"x" * 400_000
    for key in ("e1", "e2", "e3"):  # the third write evicts the first
        assert store.put(key, big) == 0
    assert store.get("e3") == big and store.get("absent") == b""
    assert store.remove_all() >= 1
    pinned = ReplicateConfig(kv_sessions=[["pinned"]])
    assert store.put("p1", big, pinned) == 0 and store.put("p2", big, pinned) == 0
    store.pin_kv_session("pinned")
    assert store.put("p3", big) == 0  # only soft-pinned objects to take
    assert store.remove_all() >= 1  # the pinned session ends with its last member

    small = b"s" * 1000
    for session in ("one", "old"):
        assert store.put(session, small, ReplicateConfig(kv_sessions=[[session]])) == 0
    assert store.release_kv_session("one").released_objects == 1
    clock.advance(120)
    assert store.put("fresh", small, ReplicateConfig(kv_sessions=[["fresh"]])) == 0
    assert store.release_stale_kv_sessions(60_000).released_objects >= 1
    assert store.release_all_kv_sessions(confirm=True).released_objects >= 1
    kv = ReplicateConfig(data_type=ObjectDataType.KVCACHE)
    assert store.put("kv", small, kv) == 0
    assert store.put("weights", small, ReplicateConfig(data_type=ObjectDataType.WEIGHT)) == 0
    assert store.release_kv_cache().released_objects == 1


# --- the tests ---------------------------------------------------------------------------------


def test_the_dashboard_is_an_importable_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    assert [(i["name"], i["type"], i["pluginId"]) for i in dashboard["__inputs"]] == [
        ("DS_PROMETHEUS", "datasource", "prometheus")
    ]
    ids = [p["id"] for p in _panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_every_metric_and_label_the_dashboard_names_is_exported(
    busy_master_scrape: Scrape,
) -> None:
    scrape = busy_master_scrape
    # The exercise reached what the panels show.
    assert scrape.value("master_evicted_key_count_total") > scrape.value(
        "master_evicted_soft_pinned_key_count_total"
    )
    assert scrape.value("master_evicted_soft_pinned_key_count_total") >= 1
    assert scrape.value("master_get_hits_total") >= 1
    assert scrape.value("master_get_misses_total") >= 1
    # The disk tier panels: bytes in both tiers, spills, a read served from disk.
    assert scrape.value("master_disk_used_bytes") > 0
    assert scrape.value("master_disk_capacity_bytes") >= scrape.value("master_disk_used_bytes")
    assert scrape.value("master_spilled_key_count_total") >= 2
    assert scrape.value("master_disk_hits_total") >= 1
    assert scrape.value("master_allocated_file_size_bytes") == scrape.value(
        "master_disk_used_bytes"
    )
    assert scrape.by_label("master_tenant_disk_bytes", "tenant")["default"] > 0
    releases = scrape.by_label("master_releases_total", "kind")
    assert releases == {"session": 1, "stale": 1, "all": 1, "kv_cache": 1}
    dashboard = json.loads(DASHBOARD.read_text())
    assert problems_of(dashboard, scrape) == []
    named = {n for _, text, _ in queries(dashboard) for n in re.findall(r"master_\w+", text)}
    assert len(named) >= 15  # the check above looked at every panel's series


@pytest.mark.parametrize(
    ("original", "mutated", "reported"),
    [
        ("master_get_hits_total", "master_get_hit_total", "'master_get_hit_total' is not exported"),
        ("master_releases_total", "master_releases", "'master_releases' is not exported"),
        ("sum by (kind)", "sum by (knd)", "master_releases_total has no label ['knd']"),
        ('sleep_state="kv_cache_released"', 'state="x"', "has no label ['state'] (matcher)"),
        ("{{tenant}}", "{{tenant_id}}", "has no label ['tenant_id'] (legend or variable)"),
        ("}, tenant)", "}, tenants)", "has no label ['tenants'] (legend or variable)"),
        ("label_values(master_key_count,", "label_values(master_keys,", "'master_keys' is not"),
        ("rate(master_get_misses_total", "rate(master_key_count", "rate() of master_key_count"),
        ("master_disk_used_bytes{", "master_disk_usage_bytes{", "'master_disk_usage_bytes' is"),
        (
            "rate(master_spilled_key_count_total",
            "rate(master_disk_used_bytes",
            "rate() of master_disk_used_bytes",
        ),
        ("master_promotion_completed_total", "master_promotion_completed", "is not exported"),
    ],
)
def test_the_check_fails_for_a_dashboard_that_names_what_is_not_exported(
    busy_master_scrape: Scrape, tmp_path: Path, original: str, mutated: str, reported: str
) -> None:
    text = DASHBOARD.read_text()
    # A JSON string holds a query's quotes escaped.
    original, mutated = json.dumps(original)[1:-1], json.dumps(mutated)[1:-1]
    assert original in text
    copy = tmp_path / "mutated.json"
    copy.write_text(text.replace(original, mutated, 1))
    problems = problems_of(json.loads(copy.read_text()), busy_master_scrape)
    assert any(reported in problem for problem in problems), problems
