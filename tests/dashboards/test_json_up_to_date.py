"""The committed dashboard JSON is exactly what the code builds, and is well formed for Grafana."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dashboards import build
from dashboards.panels import DATASOURCE, DATASOURCE_UID

ROOT = Path(__file__).resolve().parents[2]


def test_committed_json_matches_code() -> None:
    stale = build.stale(ROOT / "dashboards" / "json")
    assert not stale, f"stale dashboard JSON: {stale}; run `fleethealth dashboards build` and commit"


def test_stale_detects_a_hand_edit(tmp_path: Path) -> None:
    build.write_all(tmp_path)
    assert build.stale(tmp_path) == []
    f = tmp_path / "fleet-overview.json"
    doc = json.loads(f.read_text())
    doc["title"] = "edited by hand in the Grafana UI"
    f.write_text(json.dumps(doc, sort_keys=True, indent=2) + "\n")
    (tmp_path / "pipeline-health.json").unlink()
    assert build.stale(tmp_path) == ["fleet-overview.json", "pipeline-health.json"]
    assert build.write_all(tmp_path) == [f, tmp_path / "pipeline-health.json"]
    assert build.stale(tmp_path) == []


def test_build_is_deterministic() -> None:
    assert build.build_all() == build.build_all()


@pytest.mark.parametrize("name", sorted(build.DASHBOARDS))
def test_dashboard_is_well_formed(name: str) -> None:
    doc = json.loads(build.render(name))
    assert doc["uid"] and doc["title"].startswith("fleethealth / ")
    panels = doc["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps another panel"
                cells.add((x, y))
        if p["type"] == "row":
            continue
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE
    assert build.queries(doc), "a dashboard without queries"


def test_every_query_is_listed() -> None:
    qs = build.all_queries()
    assert sorted(qs) == sorted(build.DASHBOARDS)
    host = [e for _, e in qs["host-drilldown.json"]]
    assert any("$host" in e for e in host)
    assert any(w.startswith("annotation") for w, _ in qs["host-drilldown.json"]), "Xid annotations"
    assert any(w.startswith("variable") for w, _ in qs["host-drilldown.json"])


def test_provisioning_names_the_datasource_the_dashboards_default_to() -> None:
    prov = ROOT / "deploy" / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "fleethealth.yaml").read_text())
    assert [d["uid"] for d in ds["datasources"]] == [DATASOURCE_UID]
    for name in build.DASHBOARDS:
        variable = json.loads(build.render(name))["templating"]["list"][0]
        assert variable["type"] == "datasource" and variable["current"]["value"] == DATASOURCE_UID
    assert ds["datasources"][0]["type"] == "prometheus"
    dash = yaml.safe_load((prov / "dashboards" / "fleethealth.yaml").read_text())
    assert dash["providers"][0]["type"] == "file"


def test_every_metric_name_is_exported_by_someone() -> None:
    """Collector names come from the exporter's catalogue; service names from fleethealth.metrics_names."""
    import re

    from collectors.exporter import load_catalog
    from fleethealth import metrics_names

    known = {s.metric for s in load_catalog()}
    known |= {v for k, v in vars(metrics_names).items() if k.isupper() and isinstance(v, str)}
    for name, items in build.all_queries().items():
        for where, expr in items:
            for metric in re.findall(r"\b(fleethealth_[a-z0-9_]+)", expr):
                assert metric in known, f"{name} {where}: {metric} is exported by nothing"
