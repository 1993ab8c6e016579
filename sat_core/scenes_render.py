"""Procedural places for the scenes world: sky, wall, and ground textures seen in perspective.

``background(place, horizon, rng)`` returns a (224, 224, 3) float image. Ground textures are drawn in
ground-plane coordinates (u across, v into the distance) and projected, so grass blades, sand
ripples, road markings and floor planks shrink toward the horizon. ``light(image, rng)`` applies
one random lighting (exposure, colour temperature, a side light, vignette) to a finished scene.
"""

from __future__ import annotations

import numpy as np

SIZE = 224
_TEX = 256  # side of the tiled ground-plane texture


def smooth_noise(rng: np.random.Generator, shape: tuple[int, int], cells: int, octaves: int = 4) -> np.ndarray:
    """Fractal value noise in about [-1, 1]: octaves of random grids, bilinearly upsampled."""
    from PIL import Image

    out = np.zeros(shape, np.float32)
    amp, total = 1.0, 0.0
    for k in range(octaves):
        n = cells * 2**k
        grid = rng.standard_normal((n, n)).astype(np.float32)
        up = np.asarray(Image.fromarray(grid, "F").resize((shape[1], shape[0]), Image.Resampling.BILINEAR))
        out += amp * up
        total += amp
        amp *= 0.5
    return out / total


def _ground_coords(horizon: float, rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ground-plane (u across, v distance) of pixels below the horizon: a pinhole camera over a
    flat plane sees the point (u, v) at dy = 120 / v px below the horizon."""
    dy = np.maximum(rows - horizon, 0.6)[:, None]  # (h, 1)
    u = (cols[None, :] - SIZE / 2) * 3.0 / dy  # (h, W)
    v = np.broadcast_to(120.0 / dy, u.shape)  # (h, W)
    return u, v


def _sample(tex: np.ndarray, u: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Nearest-neighbour lookup in a tiled texture (T, T[, C])."""
    # centred in the tile: the (non-periodic) tile's wrap-around stays far from the image centre
    iu = (np.floor(u * scale).astype(np.int64) + tex.shape[1] // 2) % tex.shape[1]
    iv = np.floor(v * scale).astype(np.int64) % tex.shape[0]
    return tex[iv, iu]


def _sky(rng: np.random.Generator, height: int) -> np.ndarray:
    """Blue (or overcast, or evening) gradient with soft clouds. (height, W, 3)."""
    kind = rng.choice(["clear", "clear", "overcast", "evening"])
    top = {"clear": (60, 120, 205), "overcast": (150, 160, 172), "evening": (70, 90, 160)}[kind]
    low = {"clear": (175, 210, 240), "overcast": (205, 208, 212), "evening": (245, 180, 120)}[kind]
    top = np.add(top, rng.uniform(-15, 15, 3))
    low = np.add(low, rng.uniform(-10, 10, 3))
    t = np.linspace(0, 1, SIZE)[:height, None, None] if height else np.zeros((0, 1, 1))
    sky = top + (low - top) * t  # (height, 1, 3)
    sky = np.broadcast_to(sky, (height, SIZE, 3)).copy()
    if height:
        cover = rng.uniform(0.0, 0.5 if kind != "overcast" else 0.1)
        clouds = np.clip((smooth_noise(rng, (height, SIZE), 3, 4) + cover) * 2.0, 0, 1)[..., None]
        sky = sky * (1 - 0.7 * clouds) + 0.7 * clouds * np.array([248.0, 248, 250])
    return sky


def _wall(rng: np.random.Generator, height: int) -> np.ndarray:
    base = rng.choice([(225, 215, 195), (200, 215, 225), (215, 205, 220), (235, 230, 220), (200, 215, 190)])
    base = np.add(base, rng.uniform(-12, 12, 3))
    shade = np.linspace(-14, 6, max(height, 1))[:height, None, None]
    wall = base + shade + 3 * smooth_noise(rng, (height, SIZE), 4, 2)[..., None]
    if height > 6:  # skirting board
        wall[-4:] = np.array(base) * 0.55
    return wall


def _ground(place: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The ground texture (h, W, 3) at ground-plane coordinates (u, v)."""
    tex_noise = smooth_noise(rng, (_TEX, _TEX), 8, 4)  # (T, T) tiles the plane
    fine = rng.standard_normal((_TEX, _TEX)).astype(np.float32)
    n = _sample(tex_noise, u, v, 6.0)
    f = _sample(fine, u, v, 40.0)
    if place == "grass":
        base = np.array([85, 145, 55]) + rng.uniform(-20, 20, 3) * [1, 1, 0.5]
        img = base * (1 + 0.18 * n[..., None] + 0.12 * f[..., None])
    elif place == "sand":
        base = np.array([222, 200, 155]) + rng.uniform(-15, 12, 3)
        ripples = np.sin(v * 3.0 + 1.5 * n + u * 0.3)
        img = base * (1 + 0.06 * ripples[..., None] + 0.05 * f[..., None] + 0.05 * n[..., None])
    elif place == "snow":
        base = np.array([232, 238, 246]) + rng.uniform(-10, 6, 3)
        img = base * (1 + 0.05 * n[..., None] + 0.015 * f[..., None])
    elif place == "water":
        base = np.array([50, 115, 175]) + rng.uniform(-20, 20, 3)
        waves = np.sin(v * 9.0 + 2.0 * n)
        img = base * (1 + 0.12 * waves[..., None] + 0.04 * f[..., None])
        img += 60 * np.clip(waves - 0.85, 0, None)[..., None] * 4  # glints
    elif place == "road":
        grey = rng.uniform(75, 110)
        img = grey * (1 + 0.05 * n + 0.1 * f)[..., None] * np.ones(3)
        half = rng.uniform(2.5, 4.0)  # road half-width in plane units
        verge = np.array([95, 140, 60]) if rng.random() < 0.6 else np.array([150, 135, 110])
        img = np.where((np.abs(u) > half)[..., None], verge * (1 + 0.15 * n[..., None]), img)
        line = rng.choice([(235, 235, 230), (235, 200, 50)])
        dashes = (np.abs(u) < 0.08) & (np.mod(v, 1.2) < 0.6)
        img = np.where(dashes[..., None], np.array(line, float), img)
    else:  # floor / table: wooden planks (or tiles on some floors)
        wood = np.array([165, 112, 70]) if place == "floor" else np.array([190, 140, 95])
        wood = wood + rng.uniform(-25, 25) + rng.uniform(-8, 8, 3)
        if place == "floor" and rng.random() < 0.3:
            tiles = (np.floor(u * 1.2) + np.floor(v * 6)) % 2
            img = np.array([215, 212, 205]) * (1 - 0.12 * tiles[..., None] + 0.02 * f[..., None])
        else:
            width = 0.9 if place == "floor" else 1.6
            plank = np.floor(u / width)
            tone = np.sin(plank * 12.9898) * 0.08  # a fixed tone per plank
            grain = _sample(smooth_noise(rng, (_TEX, _TEX), 4, 3), u * 8, v * 0.5, 6.0)
            seam = (np.mod(u / width, 1.0) < 0.04) * -0.25
            img = wood * (1 + tone + 0.08 * grain + seam)[..., None]
    return img


def background(place: str, horizon: int, rng: np.random.Generator) -> np.ndarray:
    """A place as a (224, 224, 3) float image; rows above ``horizon`` are sky (or wall indoors)."""
    rows, cols = np.arange(SIZE, dtype=np.float64), np.arange(SIZE, dtype=np.float64)
    if place == "sky":
        return _sky(rng, SIZE)
    top = _wall(rng, horizon) if place in ("floor", "table") else _sky(rng, horizon)
    u, v = _ground_coords(horizon, rows[horizon:], cols)
    ground = _ground(place, rng, u, v)
    if place == "sand":  # a strip of sea between the beach and the sky
        sea = int(rng.integers(8, 22))
        wu, wv = u[:sea], v[:sea]
        ground[:sea] = _ground("water", rng, wu, wv)
    if place not in ("floor", "table"):  # haze: the far ground fades into the sky's colour
        haze = np.exp(-(rows[horizon:] - horizon) / 12.0)[:, None, None] * 0.5
        ground = ground * (1 - haze) + haze * top[-1:].mean(axis=1, keepdims=True)
    return np.concatenate([top, ground], axis=0)


def shadow(image: np.ndarray, cx: float, foot: float, width: float, rng_shift: float, strength: float) -> None:
    """Darken a soft ellipse under an object standing at (cx, foot), in place."""
    a, b = 0.55 * width, 0.10 * width + 2
    cx = cx + rng_shift * width
    x0, x1 = int(max(cx - a, 0)), int(min(cx + a + 1, SIZE))
    y0, y1 = int(max(foot - b, 0)), int(min(foot + b + 1, SIZE))
    if x0 >= x1 or y0 >= y1:
        return
    ys, xs = np.mgrid[y0:y1, x0:x1]
    r2 = ((xs - cx) / a) ** 2 + ((ys - foot) / b) ** 2
    dark = strength * np.clip(1 - r2, 0, 1) ** 0.7  # (h, w)
    image[y0:y1, x0:x1] *= (1 - dark)[..., None]


def light(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One random lighting over the whole scene, then sensor noise; returns uint8 (H, W, 3)."""
    exposure = rng.uniform(0.8, 1.12)
    warm = rng.uniform(-0.07, 0.07)
    tint = np.array([1 + warm, 1.0, 1 - warm])
    ys, xs = np.mgrid[0:SIZE, 0:SIZE] / SIZE - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    side = 1 + rng.uniform(0, 0.18) * (np.cos(angle) * xs + np.sin(angle) * ys)  # (H, W)
    vignette = 1 - rng.uniform(0, 0.35) * (xs**2 + ys**2)
    out = image * (exposure * side * vignette)[..., None] * tint
    out += rng.normal(0, rng.uniform(1.5, 4.0), size=out.shape)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
