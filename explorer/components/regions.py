"""A region of the α grid drawn on the image: the figure to draw on, and its selection -> grid cells."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go

from sat_core.regions import cells_at_points, cells_in_box, cells_in_polygon


def region_figure(crop: np.ndarray, grid: tuple[int, int], region: np.ndarray | None, height: int = 380) -> go.Figure:
    """The crop the encoder saw, the chosen cells outlined, and an invisible point on every cell centre
    (box and lasso selections report the points they cover)."""
    side = crop.shape[0]
    gh, gw = grid
    rows, cols = np.mgrid[0:gh, 0:gw]
    xs, ys = ((cols + 0.5) * side / gw).reshape(-1), ((rows + 0.5) * side / gh).reshape(-1)  # (L,)
    fig = go.Figure(go.Image(z=crop, hoverinfo="skip"))
    clear = {"marker": {"opacity": 0}}
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="cells", marker={"size": 6, "opacity": 0},
                             selected=clear, unselected=clear,
                             customdata=np.stack([rows.reshape(-1), cols.reshape(-1)], axis=-1),
                             hovertemplate="row %{customdata[0]}, col %{customdata[1]}<extra></extra>"))
    if region is not None and region.any():
        rr, cc = np.nonzero(region)
        fig.add_trace(go.Scatter(x=(cc + 0.5) * side / gw, y=(rr + 0.5) * side / gh, mode="markers", name="region",
                                 marker={"symbol": "square-open", "size": max(4, int(side / gh * 0.9)),
                                         "color": "white", "line": {"width": 1}}, hoverinfo="skip"))
    fig.update_layout(height=height, margin={"l": 0, "r": 0, "t": 0, "b": 0}, showlegend=False, dragmode="select")
    fig.update_xaxes(visible=False, range=[0, side])
    fig.update_yaxes(visible=False, range=[side, 0], scaleanchor="x")
    return fig


def selection_cells(selection: Mapping[str, Any] | None, grid: tuple[int, int], side: float) -> np.ndarray:
    """Bool (gh, gw): the cells a plotly selection covers (boxes, lassos and picked points, in px of the crop)."""
    region = np.zeros(grid, dtype=bool)
    if not selection:
        return region
    for box in selection.get("box") or []:
        if box.get("x") and box.get("y"):
            region |= cells_in_box(grid, side, box["x"], box["y"])
    for lasso in selection.get("lasso") or []:
        if len(lasso.get("x") or []) >= 3:
            region |= cells_in_polygon(grid, side, lasso["x"], lasso["y"])
    points = [p for p in selection.get("points") or [] if "x" in p and "y" in p]
    if points:
        region |= cells_at_points(grid, side, [p["x"] for p in points], [p["y"] for p in points])
    return region
