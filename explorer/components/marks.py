"""Marks on an α figure: hard attention's sampled locations, counted per grid cell."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go


def add_location_marks(fig: go.Figure, locations: Sequence[int], grid: tuple[int, int], side: int,
                       name: str = "sampled locations") -> go.Figure:
    """Red × on every cell in ``locations`` (row-major indices); several samples on one cell show their count."""
    gh, gw = grid
    counts = Counter(int(x) for x in locations if int(x) >= 0)
    cells = sorted(counts)
    rows, cols = [i // gw for i in cells], [i % gw for i in cells]
    fig.add_trace(go.Scatter(
        x=[(c + 0.5) * side / gw for c in cols], y=[(r + 0.5) * side / gh for r in rows], name=name,
        mode="markers+text", text=[str(counts[i]) if counts[i] > 1 else "" for i in cells],
        textposition="top right", textfont={"color": "white", "size": 13},
        marker={"symbol": "x", "size": 14, "color": "red", "line": {"width": 2, "color": "white"}},
        customdata=[[r, c, counts[i]] for r, c, i in zip(rows, cols, cells)],
        hovertemplate="row %{customdata[0]}, col %{customdata[1]}: %{customdata[2]} sample(s)<extra></extra>",
    ))
    return fig
