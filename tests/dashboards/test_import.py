"""The built dashboards import through Grafana's UI (Dashboards > New > Import) into any Grafana.

No Grafana runs here, so the test does what the import does with the JSON: it asks for the
``__inputs`` (none are needed), drops the ``id``, resolves the template variables, and interpolates
``$var`` / ``${var}`` in every datasource reference and query. What makes a panel empty after an
import — a hard-coded datasource uid that the target Grafana does not have, an undeclared input, a
variable no one defines, a selector that ignores the chosen cluster — fails here.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dashboards import build
from dashboards.panels import DATASOURCE_VAR

GRAFANA_GLOBALS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__all",
                   "__from", "__to", "__dashboard", "__name"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
NAMES = sorted(build.DASHBOARDS)


def _doc(name: str) -> dict[str, Any]:
    return json.loads(build.render(name))


def _walk(obj: Any, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, obj


def _datasource_refs(doc: dict[str, Any]):
    """Every datasource reference Grafana resolves: panels, targets, annotations, variables."""
    def rec(obj: Any, where: str):
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k == "datasource" and v is not None:
                    yield where, v
                else:
                    yield from rec(v, f"{where}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                yield from rec(v, f"{where}[{i}]")
    yield from rec(doc, "")


def interpolate(doc: dict[str, Any], values: dict[str, str]) -> dict[str, Any]:
    """Grafana's template interpolation over the whole document (strings only)."""
    def sub(s: str) -> str:
        def one(m: re.Match[str]) -> str:
            name = m.group(1) or m.group(2)
            return values.get(name, m.group(0))
        return _VAR.sub(one, s)

    def rec(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: rec(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [rec(v) for v in obj]
        return sub(obj) if isinstance(obj, str) else obj
    return rec(doc)


def import_dashboard(doc: dict[str, Any], chosen_datasource: str, cluster: str = ".*") -> dict[str, Any]:
    """What the import does before saving: the form's inputs, a fresh id, the variables resolved."""
    inputs = doc.get("__inputs") or []
    text = json.dumps(doc)
    declared = {i["name"] for i in inputs}
    for placeholder in set(re.findall(r"\$\{(DS_[A-Z0-9_]+)\}", text)):
        assert placeholder in declared, f"${{{placeholder}}} is used but not declared in __inputs"
    assert all(i.get("type") != "datasource" or i.get("pluginId") == "prometheus" for i in inputs)
    doc = {**doc, "id": None}
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    values = {DATASOURCE_VAR: chosen_datasource, "cluster": cluster, "host": "gpu-node-001"}
    assert set(values) >= set(variables), f"variables the import cannot resolve: {set(variables) - set(values)}"
    return interpolate(doc, values)


@pytest.mark.parametrize("name", NAMES)
def test_no_hard_coded_datasource(name: str) -> None:
    doc = _doc(name)
    refs = list(_datasource_refs(doc))
    assert refs
    for where, ref in refs:
        assert isinstance(ref, dict) and ref.get("type") == "prometheus", (where, ref)
        assert ref.get("uid") == f"${{{DATASOURCE_VAR}}}", f"{name}{where}: datasource {ref} is not $datasource"


@pytest.mark.parametrize("name", NAMES)
def test_datasource_and_cluster_variables(name: str) -> None:
    doc = _doc(name)
    variables = doc["templating"]["list"]
    assert [v["name"] for v in variables[:2]] == [DATASOURCE_VAR, "cluster"], "datasource first: others use it"
    ds, cluster = variables[0], variables[1]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert cluster["type"] == "query" and cluster["includeAll"] and cluster["multi"]
    assert cluster["allValue"] == ".*", "All must also match series that carry no cluster label"
    assert cluster["query"].startswith("label_values(") and cluster["query"].endswith(", cluster)")


@pytest.mark.parametrize("name", NAMES)
def test_every_variable_is_defined(name: str) -> None:
    doc = _doc(name)
    defined = {v["name"] for v in doc["templating"]["list"]} | GRAFANA_GLOBALS
    for where, value in _walk(doc):
        if isinstance(value, str):
            for m in _VAR.finditer(value):
                var = m.group(1) or m.group(2)
                assert var in defined, f"{name}{where}: ${var} is defined nowhere"


@pytest.mark.parametrize("name", NAMES)
def test_every_selector_follows_the_cluster_variable(name: str) -> None:
    for where, expr in build.queries(_doc(name)):
        if where.startswith("variable 'cluster'"):
            continue
        for m in re.finditer(r"\b(fleethealth_[a-z0-9_]+|up)\b(\{[^}]*\})?", expr):
            assert m.group(2) and 'cluster=~"$cluster"' in m.group(2), f"{name} {where}: {m.group(0)} in {expr}"


@pytest.mark.parametrize("name", NAMES)
def test_import_into_another_grafana_points_every_panel_at_the_chosen_datasource(name: str) -> None:
    doc = _doc(name)
    assert doc.get("id") is None, "an exported id makes the import overwrite another dashboard"
    assert doc["uid"] and len(doc["uid"]) <= 40, "Grafana uids are at most 40 characters"
    imported = import_dashboard(doc, "their-prometheus-uid", cluster="fleet-a|fleet-b")
    for where, ref in _datasource_refs(imported):
        if where.startswith(".templating.list[0]"):
            continue
        assert ref["uid"] == "their-prometheus-uid", f"{name}{where}: still {ref['uid']} after import"
    text = json.dumps(imported)
    assert "$" not in re.sub(r"\$__[a-z_]+", "", text).replace("$labels", ""), "unresolved variable after import"
    assert 'cluster=~\\"fleet-a|fleet-b\\"' in text
