"""Procedural places for the scenes world: sky, wall, and ground textures seen in perspective.

``background(place, horizon, rng, styles)`` returns a (224, 224, 3) float image. Ground textures are
drawn in ground-plane coordinates (u across, v into the distance) and projected, so grass blades, sand
ripples, road markings and floor planks shrink toward the horizon. ``light(image, rng)`` applies
one random lighting (exposure, colour cast, a side light, vignette) to a finished scene.

Every surface comes in named styles (``GROUND_STYLES``, ``SKY_STYLES``, ``WALL_STYLES``). The styles of
``HELD_OUT`` are never drawn for the training, validation and test splits: they make the shifted split
(``layout``), on which generalisation is measured. Those of ``HELD_OUT_VALIDATION`` make a second shifted set,
written over validation scenes, on which choices about generalisation are made without reading the first.
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


# The styles of each surface; those in HELD_OUT are drawn only for the shifted split.
GROUND_STYLES = {
    "grass": ("meadow", "lush", "mown", "dry", "flowers", "weeds"),
    "sand": ("ripples", "dunes", "pebbles", "wet", "desert", "shore"),
    "snow": ("powder", "crust", "tracks", "slush", "drifts", "glitter"),
    "water": ("waves", "calm", "lake", "murky", "mirror", "choppy"),
    "road": ("asphalt", "worn", "cobbles", "gravel", "concrete", "dirt"),
    "floor": ("planks", "tiles", "carpet", "stone", "parquet", "screed"),
    "table": ("wood", "painted", "cloth", "marble", "glass", "walnut"),
}
SKY_STYLES = ("clear", "overcast", "evening", "dusk", "stormy", "hazy", "deep")
WALL_STYLES = ("plain", "stripes", "panels", "brick", "tiled")
HELD_OUT = frozenset({"mown", "pebbles", "tracks", "lake", "cobbles", "carpet", "cloth", "dusk", "stripes"})
HELD_OUT_VALIDATION = frozenset({"dry", "wet", "slush", "murky", "gravel", "stone", "marble", "stormy", "panels"})
# Drawn by training scenes alone (a share TRAINING_ONLY_SHARE of them), so that validation and test scenes stay
# those of the styles above.
TRAINING_ONLY = frozenset({"flowers", "weeds", "desert", "shore", "drifts", "glitter", "mirror", "choppy", "concrete",
                           "dirt", "parquet", "screed", "glass", "walnut", "hazy", "deep", "brick", "tiled"})
TRAINING_ONLY_SHARE = 0.5


def styles_for(place: str, shifted: bool, held_out: str = "test",
               training_only: bool = False) -> dict[str, tuple[str, ...]]:
    """The styles a scene at ``place`` may draw, per surface (ground, sky, wall): for a shifted set the
    held-out ones of its side (``held_out``: "test", the shifted split; "validation"), for every other
    split those neither side holds out, and with ``training_only`` (some training scenes) also those of
    ``TRAINING_ONLY``."""
    group = HELD_OUT_VALIDATION if held_out == "validation" else HELD_OUT
    own = () if training_only else TRAINING_ONLY

    def pick(names: tuple[str, ...]) -> tuple[str, ...]:
        if shifted:
            return tuple(n for n in names if n in group)
        return tuple(n for n in names if n not in HELD_OUT and n not in HELD_OUT_VALIDATION and n not in own)

    return {"ground": pick(GROUND_STYLES.get(place, ())), "sky": pick(SKY_STYLES), "wall": pick(WALL_STYLES)}


def _sky(rng: np.random.Generator, height: int, kind: str = "clear") -> np.ndarray:
    """A sky gradient (clear blue, overcast, evening or dusk) with soft clouds. (height, W, 3)."""
    top = {"clear": (60, 120, 205), "overcast": (150, 160, 172), "evening": (70, 90, 160),
           "dusk": (95, 60, 120), "stormy": (85, 90, 105), "hazy": (185, 190, 185), "deep": (25, 65, 170)}[kind]
    low = {"clear": (175, 210, 240), "overcast": (205, 208, 212), "evening": (245, 180, 120),
           "dusk": (235, 150, 170), "stormy": (150, 155, 165), "hazy": (232, 225, 200), "deep": (105, 155, 225)}[kind]
    top = np.add(top, rng.uniform(-15, 15, 3))
    low = np.add(low, rng.uniform(-10, 10, 3))
    t = np.linspace(0, 1, SIZE)[:height, None, None] if height else np.zeros((0, 1, 1))
    sky = top + (low - top) * t  # (height, 1, 3)
    sky = np.broadcast_to(sky, (height, SIZE, 3)).copy()
    if height:
        cover = rng.uniform(0.0, 0.5 if kind not in ("overcast", "deep") else 0.1)
        clouds = np.clip((smooth_noise(rng, (height, SIZE), 3, 4) + cover) * 2.0, 0, 1)[..., None]
        cloud = np.array([135.0, 137, 145]) if kind == "stormy" else np.array([248.0, 248, 250])  # dark rain clouds
        sky = sky * (1 - 0.7 * clouds) + 0.7 * clouds * cloud
    return sky


def _wall(rng: np.random.Generator, height: int, kind: str = "plain") -> np.ndarray:
    base = rng.choice([(225, 215, 195), (200, 215, 225), (215, 205, 220), (235, 230, 220), (200, 215, 190)])
    base = np.add(base, rng.uniform(-12, 12, 3))
    shade = np.linspace(-14, 6, max(height, 1))[:height, None, None]
    wall = base + shade + 3 * smooth_noise(rng, (height, SIZE), 4, 2)[..., None]
    rows, cols = np.arange(height)[:, None], np.arange(SIZE)[None, :]
    if kind == "brick":  # red-brown bricks in a running bond, pale mortar
        brick_h, brick_w = rng.uniform(6, 10), rng.uniform(16, 26)
        course = np.floor(rows / brick_h)
        mortar = (np.mod(rows, brick_h) < 1.2) | (np.mod(cols + 0.5 * brick_w * np.mod(course, 2), brick_w) < 1.5)
        tone = 1 + 0.08 * np.sin(course * 12.9898 + np.floor(cols / brick_w) * 78.233)
        brick = np.add((165, 85, 65), rng.uniform(-20, 20, 3)) * tone[..., None]
        wall = np.where(mortar[..., None], np.array([205.0, 200, 190]), brick)
    elif kind == "tiled":  # square glazed tiles with grout lines
        side = rng.uniform(9, 15)
        grout = (np.mod(rows, side) < 1.2) | (np.mod(cols, side) < 1.2)
        wall = np.where(grout[..., None], wall * 0.8, wall * 1.04)
    if kind == "stripes":  # wallpaper: vertical stripes of a second tone
        period = rng.uniform(10, 22)
        stripe = (np.mod(np.arange(SIZE) / period, 1.0) < 0.5)[None, :, None]
        wall = np.where(stripe, wall * rng.uniform(0.8, 0.9), wall)
    elif kind == "panels" and height > 12:  # wainscot: a darker panelled lower third with vertical seams
        low = height - height // 3
        seams = (np.mod(np.arange(SIZE), rng.uniform(26, 40)) < 2)[None, :, None]
        wall[low:] = np.where(seams, wall[low:] * 0.6, wall[low:] * rng.uniform(0.7, 0.8))
    if height > 6:  # skirting board
        wall[-4:] = np.array(base) * 0.55
    return wall


# Ground textures: (h, W, 3) at ground-plane coordinates (u, v), from the plane's smooth noise n and fine noise f.

def _grass(place: str, style: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, n: np.ndarray,
           f: np.ndarray) -> np.ndarray:
    """Grass: plain, lush (clumps of clover), mown (stripes) or dry (straw)."""
    base = np.array([85, 145, 55]) + rng.uniform(-20, 20, 3) * [1, 1, 0.5]
    if style == "lush":  # darker, with clumps of lighter clover
        base = base * [0.8, 0.9, 0.8]
        clumps = np.clip(_sample(smooth_noise(rng, (_TEX, _TEX), 16, 2), u, v, 9.0) * 3 - 1, 0, 1)
        img = base * (1 + 0.15 * n[..., None] + 0.1 * f[..., None] + 0.25 * clumps[..., None])
    elif style == "dry":  # straw-coloured, patchy
        base = np.array([175, 160, 95]) + rng.uniform(-15, 15, 3)
        img = base * (1 + 0.2 * n[..., None] + 0.15 * f[..., None])
    elif style == "flowers":  # a meadow dotted with small white, yellow and pink flowers
        img = base * (1 + 0.15 * n[..., None] + 0.1 * f[..., None])
        pick = _sample(rng.random((_TEX, _TEX)), u, v, 10.0)
        palette = np.array([[245.0, 245, 240], [240, 210, 60], [230, 130, 170]])
        img = np.where((pick > 0.94)[..., None], palette[np.clip((pick - 0.94) / 0.02, 0, 2).astype(int)], img)
    elif style == "weeds":  # uneven: yellow-green and brown patches
        mix = np.clip(n * 2 + 0.5, 0, 1)[..., None]
        img = (np.array([125.0, 150, 60]) * mix + np.array([120.0, 105, 70]) * (1 - mix)) * (1 + 0.15 * f[..., None])
    elif style == "mown":  # striped lawn
        stripes = np.where(np.mod(u, 2.0) < 1.0, 1.12, 0.9)
        img = base * (stripes * (1 + 0.05 * n + 0.06 * f))[..., None]
    else:
        img = base * (1 + 0.18 * n[..., None] + 0.12 * f[..., None])
    return img


def _sand(place: str, style: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, n: np.ndarray,
          f: np.ndarray) -> np.ndarray:
    """Sand: ripples, dunes, pebbles or wet (dark, with sheen)."""
    base = np.array([222, 200, 155]) + rng.uniform(-15, 12, 3)
    if style == "dunes":  # long soft swells
        swell = np.sin(v * 0.8 + 3.0 * n)
        img = base * (1 + 0.1 * swell[..., None] + 0.03 * f[..., None])
    elif style == "wet":  # darker, smooth, with bright sheen where water stands
        sheen = np.clip(n * 3 - 1.6, 0, 1)[..., None]
        img = base * 0.8 * (1 + 0.03 * f[..., None]) * (1 - sheen) + sheen * np.array([200.0, 205, 210])
    elif style == "desert":  # orange-red sand, wind streaks across
        base = np.array([205, 130, 80]) + rng.uniform(-15, 15, 3)
        img = base * (1 + 0.08 * np.sin(u * 1.5 + v * 0.2 + 2.0 * n)[..., None] + 0.04 * f[..., None])
    elif style == "shore":  # a tide line of dark seaweed
        weed = (np.abs(np.sin(v * 2.0 + 2.0 * n)) < 0.06)[..., None]
        img = np.where(weed, np.array([70.0, 72, 40]), base * (1 + 0.05 * f[..., None] + 0.04 * n[..., None]))
    elif style == "pebbles":  # grey stones scattered on darker sand
        stones = _sample(rng.random((_TEX, _TEX)), u, v, 14.0) > 0.9
        img = np.where(stones[..., None], np.array([140.0, 135, 130]), base * 0.9 * (1 + 0.05 * f[..., None]))
    else:
        ripples = np.sin(v * 3.0 + 1.5 * n + u * 0.3)
        img = base * (1 + 0.06 * ripples[..., None] + 0.05 * f[..., None] + 0.05 * n[..., None])
    return img


def _snow(place: str, style: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, n: np.ndarray,
          f: np.ndarray) -> np.ndarray:
    """Snow: plain, crust (icy patches), tracks or slush (grey-brown, trodden)."""
    base = np.array([232, 238, 246]) + rng.uniform(-10, 6, 3)
    if style == "crust":  # icy, blue-grey patches
        ice = np.clip(n * 2, 0, 1)[..., None]
        img = base * (1 + 0.02 * f[..., None]) * (1 - 0.12 * ice * np.array([1.0, 0.7, 0.2]))
    elif style == "slush":  # dirty, melting: brown-grey blotches
        dirt = np.clip(n * 2 + 0.3, 0, 1)[..., None]
        img = base * (1 + 0.03 * f[..., None]) * (1 - 0.3 * dirt * np.array([0.8, 0.9, 1.1]))
    elif style == "drifts":  # deep drifts: broad blue shadows
        drift = np.sin(u * 0.6 + 2.0 * n)[..., None]
        img = base * (1 + 0.02 * f[..., None]) * (1 - 0.12 * np.clip(drift, 0, 1) * np.array([1.0, 0.8, 0.4]))
    elif style == "glitter":  # sunlit powder with sparkles
        img = np.where((f > 2.3)[..., None], np.array([255.0, 255, 255]), base * (1 + 0.04 * n[..., None]))
    elif style == "tracks":  # ski tracks running into the distance
        tracks = (np.mod(u + 0.3 * np.sin(v * 0.5), 1.7) < 0.12)[..., None]
        img = np.where(tracks, base * 0.8, base * (1 + 0.04 * n[..., None]))
    else:
        img = base * (1 + 0.05 * n[..., None] + 0.015 * f[..., None])
    return img


def _water(place: str, style: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, n: np.ndarray,
           f: np.ndarray) -> np.ndarray:
    """Water: waves with glints, calm, a teal lake or murky (brown-green)."""
    base = np.array([50, 115, 175]) + rng.uniform(-20, 20, 3)
    if style == "calm":  # smooth, darker, a few ripples
        img = base * 0.9 * (1 + 0.05 * np.sin(v * 4.0 + n)[..., None] + 0.02 * f[..., None])
    elif style == "murky":  # brown-green, dull, slow swirls
        base = np.array([75, 100, 90]) + rng.uniform(-12, 12, 3)
        img = base * (1 + 0.12 * np.sin(u * 0.7 + v * 6.0 + 3.0 * n)[..., None] + 0.03 * f[..., None])
    elif style == "mirror":  # still water mirroring a pale sky, vertical streaks
        base = np.array([150, 175, 200]) + rng.uniform(-15, 15, 3)
        img = base * (1 + 0.07 * np.sin(u * 8.0 + n)[..., None] + 0.02 * f[..., None])
    elif style == "choppy":  # dark water with short white caps
        base = base * 0.75
        caps = (np.sin(v * 14.0 + 3.0 * n) * np.cos(u * 5.0 + 4.0 * n) > 0.85)[..., None]
        img = np.where(caps, np.array([235.0, 240, 245]), base * (1 + 0.06 * f[..., None]))
    elif style == "lake":  # green-teal, diagonal streaks
        base = np.array([45, 120, 110]) + rng.uniform(-15, 15, 3)
        streaks = np.sin((u + v) * 5.0 + 2.0 * n)
        img = base * (1 + 0.1 * streaks[..., None] + 0.03 * f[..., None])
    else:
        waves = np.sin(v * 9.0 + 2.0 * n)
        img = base * (1 + 0.12 * waves[..., None] + 0.04 * f[..., None])
        img += 60 * np.clip(waves - 0.85, 0, None)[..., None] * 4  # glints
    return img


def _road(place: str, style: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, n: np.ndarray,
          f: np.ndarray) -> np.ndarray:
    """A road with dashes and verges: asphalt, cobbles, worn or gravel."""
    grey = rng.uniform(75, 110)
    if style == "cobbles":  # a grid of rounded stones with dark joints
        cu, cv = np.mod(u * 2.0, 1.0), np.mod(v * 4.0 + 0.5 * np.floor(u * 2.0), 1.0)
        joint = (np.minimum(cu, 1 - cu) < 0.08) | (np.minimum(cv, 1 - cv) < 0.08)
        img = (grey + 25) * (1 - 0.45 * joint + 0.06 * f)[..., None] * np.array([1.05, 1.0, 0.92])
    elif style == "gravel":  # light brown-grey grit
        img = (grey + 45) * (1 + 0.05 * n + 0.25 * f)[..., None] * np.array([1.08, 1.0, 0.88])
    elif style == "concrete":  # pale slabs with joints across
        joint = np.mod(v * 1.5, 1.0) < 0.06
        img = (grey + 65) * (1 + 0.04 * n + 0.05 * f - 0.25 * joint)[..., None] * np.ones(3)
    elif style == "dirt":  # a brown track with two darker ruts
        ruts = (np.abs(np.abs(u) - 1.2) < 0.25)
        img = np.array([145.0, 115, 80]) * (1 + 0.1 * n - 0.2 * ruts + 0.1 * f)[..., None]
    elif style == "worn":  # patched, lighter asphalt
        patches = np.clip(n * 3, -1, 1)
        img = (grey + 20) * (1 + 0.12 * patches + 0.08 * f)[..., None] * np.ones(3)
    else:
        img = grey * (1 + 0.05 * n + 0.1 * f)[..., None] * np.ones(3)
    half = rng.uniform(2.5, 4.0)  # road half-width in plane units
    verge = np.array([95, 140, 60]) if rng.random() < 0.6 else np.array([150, 135, 110])
    img = np.where((np.abs(u) > half)[..., None], verge * (1 + 0.15 * n[..., None]), img)
    line = rng.choice([(235, 235, 230), (235, 200, 50)])
    dashes = (np.abs(u) < 0.08) & (np.mod(v, 1.2) < 0.6)
    img = np.where(dashes[..., None], np.array(line, float), img)
    return img


def _indoor(place: str, style: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, n: np.ndarray,
            f: np.ndarray) -> np.ndarray:
    """Floor or table: wooden planks, tiles, paint, carpet, cloth, stone flags or marble."""
    wood = np.array([165, 112, 70]) if place == "floor" else np.array([190, 140, 95])
    wood = wood + rng.uniform(-25, 25) + rng.uniform(-8, 8, 3)
    if style == "tiles":
        tiles = (np.floor(u * 1.2) + np.floor(v * 6)) % 2
        img = np.array([215, 212, 205]) * (1 - 0.12 * tiles[..., None] + 0.02 * f[..., None])
    elif style == "stone":  # large grey flagstones, a tone each, dark joints
        su, sv = u / 1.4, v * 2.5 + 0.5 * np.floor(u / 1.4)
        joint = (np.mod(su, 1.0) < 0.05) | (np.mod(sv, 1.0) < 0.07)
        tone = np.sin(np.floor(su) * 12.9898 + np.floor(sv) * 78.233) * 0.1
        img = np.array([150.0, 148, 140]) * (1 + tone + 0.06 * f - 0.4 * joint)[..., None]
    elif style == "marble":  # white with grey veins
        veins = np.abs(np.sin(u * 2.0 + v * 3.0 + 5.0 * n)) < 0.06
        img = np.array([238.0, 236, 232]) * (1 - 0.3 * veins + 0.02 * f)[..., None]
    elif style == "parquet":  # small blocks, their grain alternating
        bu, bv = np.floor(u * 2.0), np.floor(v * 8.0)
        across = np.mod(bu + bv, 2) == 0
        grain = np.where(across, np.sin(u * 40.0), np.sin(v * 160.0))
        edge = (np.mod(u * 2.0, 1.0) < 0.06) | (np.mod(v * 8.0, 1.0) < 0.08)
        img = wood * (1 + 0.05 * grain + 0.05 * np.sin(bu * 3.1 + bv * 7.7) - 0.2 * edge)[..., None]
    elif style == "screed":  # polished grey concrete, cloudy
        img = np.array([172.0, 170, 166]) * (1 + 0.1 * n + 0.02 * f)[..., None]
    elif style == "glass":  # a pale glass top with diagonal reflections
        shine = np.clip(np.sin(u * 1.5 - v * 4.0) * 2 - 1.2, 0, 1)
        img = np.array([200.0, 215, 218]) * (1 + 0.15 * shine + 0.02 * f)[..., None]
    elif style == "walnut":  # dark wood, one board, fine grain
        grain = _sample(smooth_noise(rng, (_TEX, _TEX), 4, 3), u * 8, v * 0.5, 6.0)
        img = np.array([105.0, 68, 42]) * (1 + 0.12 * grain + 0.03 * f)[..., None]
    elif style == "carpet":  # soft, fibrous, one saturated colour
        colour = np.array(rng.choice([(150, 50, 60), (60, 80, 140), (90, 110, 70)]), float)
        img = colour * (1 + 0.12 * f[..., None] + 0.08 * n[..., None])
    elif style == "painted":  # a smooth painted top
        colour = np.array(rng.choice([(235, 235, 230), (70, 75, 85), (190, 205, 215)]), float)
        img = colour * (1 + 0.03 * n[..., None] + 0.01 * f[..., None])
    elif style == "cloth":  # gingham tablecloth
        check = (np.mod(u, 1.0) < 0.5).astype(float) + (np.mod(v * 5, 1.0) < 0.5)
        colour = np.array(rng.choice([(200, 50, 50), (50, 90, 180)]), float)
        img = np.array([245.0, 245, 240]) + (colour - 245) * (check / 2)[..., None]
    else:
        width = 0.9 if place == "floor" else 1.6
        plank = np.floor(u / width)
        tone = np.sin(plank * 12.9898) * 0.08  # a fixed tone per plank
        grain = _sample(smooth_noise(rng, (_TEX, _TEX), 4, 3), u * 8, v * 0.5, 6.0)
        seam = (np.mod(u / width, 1.0) < 0.04) * -0.25
        img = wood * (1 + tone + 0.08 * grain + seam)[..., None]
    return img


_GROUNDS = {"grass": _grass, "sand": _sand, "snow": _snow, "water": _water, "road": _road}


def _ground(place: str, rng: np.random.Generator, u: np.ndarray, v: np.ndarray, style: str = "") -> np.ndarray:
    """The ground texture (h, W, 3) at ground-plane coordinates (u, v), in one of the place's styles."""
    style = style or GROUND_STYLES[place][0]
    tex_noise = smooth_noise(rng, (_TEX, _TEX), 8, 4)  # (T, T) tiles the plane
    fine = rng.standard_normal((_TEX, _TEX)).astype(np.float32)
    n = _sample(tex_noise, u, v, 6.0)
    f = _sample(fine, u, v, 40.0)
    return _GROUNDS.get(place, _indoor)(place, style, rng, u, v, n, f)


def background(place: str, horizon: int, rng: np.random.Generator,
               styles: dict[str, str] | None = None) -> np.ndarray:
    """A place as a (224, 224, 3) float image; rows above ``horizon`` are sky (or wall indoors).
    ``styles`` names the ground, sky and wall styles (each surface's first style where missing)."""
    styles = styles or {}
    rows, cols = np.arange(SIZE, dtype=np.float64), np.arange(SIZE, dtype=np.float64)
    if place == "sky":
        return _sky(rng, SIZE, styles.get("sky", "clear"))
    if place in ("floor", "table"):
        top = _wall(rng, horizon, styles.get("wall", "plain"))
    else:
        top = _sky(rng, horizon, styles.get("sky", "clear"))
    u, v = _ground_coords(horizon, rows[horizon:], cols)
    ground = _ground(place, rng, u, v, styles.get("ground", ""))
    if place == "sand":  # a strip of sea between the beach and the sky
        sea = int(rng.integers(8, 22))
        wu, wv = u[:sea], v[:sea]
        ground[:sea] = _ground("water", rng, wu, wv, "lake" if "pebbles" == styles.get("ground") else "waves")
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
    exposure = rng.uniform(0.7, 1.2)
    warm = rng.uniform(-0.12, 0.12)  # colour temperature
    green = rng.uniform(-0.05, 0.05)  # and a green / magenta cast
    tint = np.array([1 + warm, 1.0 + green, 1 - warm])
    ys, xs = np.mgrid[0:SIZE, 0:SIZE] / SIZE - 0.5
    angle = rng.uniform(0, 2 * np.pi)
    side = 1 + rng.uniform(0, 0.18) * (np.cos(angle) * xs + np.sin(angle) * ys)  # (H, W)
    vignette = 1 - rng.uniform(0, 0.35) * (xs**2 + ys**2)
    out = image * (exposure * side * vignette)[..., None] * tint
    out += rng.normal(0, rng.uniform(1.5, 4.0), size=out.shape)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
