"""Plotly figures from plain arrays and lists; ``draw_*`` put them on the page.

The α figure lays the rendered overlay (whatever the smoothing) under an invisible heat map of the
raw grid, so hovering always reads the exact α of the cell under the pointer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from sat_core import viz

from explorer.maps import ColourScale

_CLEAR = [[0.0, "rgba(0,0,0,0)"], [1.0, "rgba(0,0,0,0)"]]


def alpha_figure(
    overlay: np.ndarray,
    alpha_grid: np.ndarray,
    *,
    title: str = "",
    location: int | None = None,
    location_label: str = "sampled location",
    region: np.ndarray | None = None,
    value_name: str = "α",
    height: int = 380,
    scale: ColourScale | None = None,
) -> go.Figure:
    """The overlay image (S, S, 3) with hover values of the raw grid (gh, gw) over it and, with
    ``scale``, a colour bar labelled in real α values."""
    side = overlay.shape[0]
    gh, gw = alpha_grid.shape
    ch, cw = side / gh, side / gw
    xs, ys = (np.arange(gw) + 0.5) * cw, (np.arange(gh) + 0.5) * ch  # cell centres, px
    rows, cols = np.mgrid[0:gh, 0:gw]
    fig = go.Figure(go.Image(z=overlay, hoverinfo="skip"))
    fig.add_trace(go.Heatmap(
        z=alpha_grid, x=xs, y=ys, colorscale=_CLEAR, showscale=False, name=value_name,
        customdata=np.stack([rows, cols], axis=-1),
        hovertemplate="row %{customdata[0]}, col %{customdata[1]}<br>" + value_name + " = %{z:.4f}<extra></extra>",
    ))
    if region is not None:
        rr, cc = np.nonzero(region)
        fig.add_trace(go.Scatter(x=(cc + 0.5) * cw, y=(rr + 0.5) * ch, mode="markers", name="region",
                                 marker={"symbol": "square-open", "size": max(4, int(ch * 0.9)),
                                         "color": "white", "line": {"width": 1}}, hoverinfo="skip"))
    if location is not None and location >= 0:
        r, c = divmod(int(location), gw)
        fig.add_trace(go.Scatter(x=[(c + 0.5) * cw], y=[(r + 0.5) * ch], mode="markers", name=location_label,
                                 marker={"symbol": "x", "size": 16, "color": "red", "line": {"width": 2}},
                                 hovertemplate=f"{location_label}: row {r}, col {c}<extra></extra>"))
    if scale is not None:
        ticks = scale.ticks()
        fig.add_trace(go.Scatter(  # one invisible point: it carries the colour bar
            x=[xs[0]], y=[ys[0]], mode="markers", hoverinfo="skip", showlegend=False,
            marker={"size": 0.1, "opacity": 0, "color": [0.0], "cmin": 0.0, "cmax": 1.0, "showscale": True,
                    "colorscale": [list(stop) for stop in viz.colormap_stops(scale.cmap)],
                    "colorbar": {"title": {"text": scale.title}, "thickness": 14, "len": 0.9,
                                 "tickvals": [p for p, _ in ticks], "ticktext": [f"{v:.3g}" for _, v in ticks]}}))
    fig.update_layout(title=title or None, height=height, margin={"l": 0, "r": 0, "t": 30 if title else 0, "b": 0},
                      showlegend=False)
    fig.update_xaxes(visible=False, range=[0, side])
    fig.update_yaxes(visible=False, range=[side, 0], scaleanchor="x")
    return fig


def topk_figure(words: Sequence[str], probs: Sequence[float], chosen: str | None = None, height: int = 260) -> go.Figure:
    """Horizontal bars of the next-word distribution, the chosen word highlighted."""
    colours = ["#d62728" if w == chosen else "#1f77b4" for w in words]
    fig = go.Figure(go.Bar(x=list(probs), y=list(words), orientation="h", marker_color=colours,
                           text=[f"{p:.3f}" for p in probs], textposition="auto",
                           hovertemplate="%{y}: p = %{x:.4f}<extra></extra>"))
    fig.update_layout(height=height, margin={"l": 0, "r": 0, "t": 10, "b": 0}, xaxis_title="probability",
                      yaxis={"autorange": "reversed"})
    return fig


def logprob_figure(words: Sequence[str], logprobs: Sequence[float], flagged: Sequence[bool] | None = None,
                   height: int = 260) -> go.Figure:
    """One bar per word: log p(word | image, previous words); flagged words in orange."""
    flagged = list(flagged or [False] * len(words))
    labels = [f"{i}: {w}" for i, w in enumerate(words)]
    fig = go.Figure(go.Bar(x=labels, y=list(logprobs), marker_color=["#ff7f0e" if f else "#1f77b4" for f in flagged],
                           hovertemplate="%{x}: log p = %{y:.3f}<extra></extra>"))
    fig.update_layout(height=height, margin={"l": 0, "r": 0, "t": 10, "b": 0}, yaxis_title="log p")
    return fig


def draw_alpha(overlay: np.ndarray, alpha_grid: np.ndarray, *, key: str, **kwargs) -> None:
    st.plotly_chart(alpha_figure(overlay, alpha_grid, **kwargs), key=key, width="stretch")


def draw_topk(words: Sequence[str], probs: Sequence[float], chosen: str | None, *, key: str) -> None:
    st.plotly_chart(topk_figure(words, probs, chosen), key=key, width="stretch")


def draw_logprobs(words: Sequence[str], logprobs: Sequence[float], flagged: Sequence[bool] | None, *, key: str) -> None:
    st.plotly_chart(logprob_figure(words, logprobs, flagged), key=key, width="stretch")
