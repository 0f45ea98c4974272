"""Small, deterministic building blocks shared by the dashboard modules.

Every panel reads the Prometheus datasource chosen by the dashboard's ``$datasource`` variable
(type ``datasource``), so the JSON imports through Grafana's UI into any Grafana: its default is the
provisioned one (uid ``DATASOURCE_UID``, written by
``deploy/grafana/provisioning/datasources/fleethealth.yaml``) and any Prometheus can be picked.
Every selector carries ``cluster=~"$cluster"`` (:func:`sel`); the ``$cluster`` variable lists the
``cluster`` target label and defaults to All (``.*``, which also matches series without the label).
Panels are laid out left to right on Grafana's 24-column grid by :func:`layout`, so a dashboard
module lists panels, not coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attr
from grafanalib.core import (
    Annotations,
    Dashboard,
    GridPos,
    RowPanel,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

DATASOURCE_UID = "fleethealth-prometheus"  # the provisioned datasource: $datasource's default
DATASOURCE_VAR = "datasource"
DATASOURCE = {"type": "prometheus", "uid": "${" + DATASOURCE_VAR + "}"}
CLUSTER = 'cluster=~"$cluster"'
GRID_WIDTH = 24


def sel(metric: str, *matchers: str) -> str:
    """``metric{cluster=~"$cluster", <matchers>}``: a selector scoped to the chosen clusters."""
    return f"{metric}{{{', '.join((CLUSTER, *matchers))}}}"


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DATASOURCE)


def targets(*pairs: tuple[str, str], instant: bool = False) -> list[Target]:
    """(expr, legend) pairs -> targets with refIds A, B, C, ..."""
    return [target(e, lg, chr(ord("A") + i), instant=instant) for i, (e, lg) in enumerate(pairs)]


def timeseries(title: str, *pairs: tuple[str, str], unit: str = "short", width: int = 12,
               description: str = "", stacked: bool = False, bars: bool = False) -> TimeSeries:
    return TimeSeries(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*pairs),
        unit=unit,
        stacking={"mode": "normal", "group": "A"} if stacked else {"mode": "none", "group": "A"},
        drawStyle="bars" if bars else "line",
        fillOpacity=30 if (stacked or bars) else 0,
        legendDisplayMode="table",
        legendPlacement="right" if width >= 12 else "bottom",
        gridPos=GridPos(h=8, w=width, x=0, y=0),
    )


def stat(title: str, expr: str, *, legend: str = "", unit: str = "none", width: int = 4,
         description: str = "", thresholds: Sequence[tuple[float | None, str]] = ()) -> Stat:
    steps = [{"color": c, "value": v} for v, c in thresholds] or [{"color": "green", "value": None}]
    return Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[target(expr, legend, instant=True)],
        format=unit,
        reduceCalc="lastNotNull",
        graphMode="area",
        thresholds=steps,
        thresholdType="absolute",
        gridPos=GridPos(h=5, w=width, x=0, y=0),
    )


def table(title: str, *pairs: tuple[str, str], width: int = 12, description: str = "") -> Table:
    """An instant-query table; each target becomes a 'Value #<refId>' column merged on labels."""
    return Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=[attr.evolve(t, format="table") for t in targets(*pairs, instant=True)],
        transformations=[{"id": "merge", "options": {}},
                         {"id": "organize", "options": {"excludeByName": {"Time": True}}}],
        gridPos=GridPos(h=9, w=width, x=0, y=0),
    )


def row(title: str) -> RowPanel:
    return RowPanel(title=title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=0))


def layout(panels: Sequence[Any]) -> list[Any]:
    """Place panels left to right, wrapping at 24 columns; a row header starts a new line."""
    out: list[Any] = []
    x = y = line_h = 0
    for p in panels:
        g = p.gridPos
        if isinstance(p, RowPanel) or x + g.w > GRID_WIDTH:
            y, x, line_h = y + line_h, 0, 0
        out.append(attr.evolve(p, gridPos=GridPos(h=g.h, w=g.w, x=x, y=y)))
        x, line_h = x + g.w, max(line_h, g.h)
        if isinstance(p, RowPanel):
            y, x, line_h = y + g.h, 0, 0
    return out


def datasource_variable() -> Template:
    """The Prometheus datasource every panel reads; Grafana lists the datasources of this type."""
    t = Template(name=DATASOURCE_VAR, label="Datasource", query="prometheus", type="datasource",
                 default=DATASOURCE_UID, refresh=1, sort=0)
    t._current = {"selected": True, "text": "fleethealth Prometheus", "value": DATASOURCE_UID}
    return t


def cluster_variable() -> Template:
    """The ``cluster`` label of the scraped fleethealth targets; All by default."""
    t = Template(
        name="cluster",
        label="Cluster",
        query='label_values(up{job=~"fleethealth.*"}, cluster)',
        dataSource=DATASOURCE,
        type="query",
        includeAll=True,
        multi=True,
        allValue=".*",
        refresh=2,
        sort=1,
    )
    t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return t


def host_variable(metric: str, name: str = "host") -> Template:
    return Template(
        name=name,
        label="Host",
        query=f"label_values({sel(metric)}, host)",
        dataSource=DATASOURCE,
        type="query",
        refresh=2,  # on time-range change: new hosts appear without a reload
        sort=1,
    )


def dashboard(uid: str, title: str, description: str, panels: Sequence[Any], *,
              templates: Sequence[Template] = (), annotations: Sequence[dict[str, Any]] = (),
              tags: Sequence[str] = ()) -> Dashboard:
    return Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=["fleethealth", *tags],
        panels=layout(panels),
        templating=Templating(list=[datasource_variable(), cluster_variable(), *templates]),
        annotations=Annotations(list=list(annotations)),
        time=Time("now-30m", "now"),
        refresh="10s",
        timezone="utc",
        editable=False,
        version=1,
    ).auto_panel_ids()
