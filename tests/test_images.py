"""The image loader against a corpus of unusual and malformed files generated here."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from sat_core.config import PreprocessConfig
from sat_core.errors import ImageError
from sat_core.data.images import (
    MAX_PIXELS,
    CropInfo,
    crop_for_display,
    load_and_preprocess,
    load_image,
    preprocess,
)

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


def encode(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def halves(size: tuple[int, int], left: tuple, right: tuple, mode: str = "RGB") -> Image.Image:
    """Left half one colour, right half another."""
    image = Image.new(mode, size, left)
    image.paste(right, (size[0] // 2, 0, size[0], size[1]))
    return image


def png_header_only(width: int, height: int) -> bytes:
    """A 1-bit PNG whose header claims width×height, with a few real compressed rows."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    rows = zlib.compress(b"\x00" * (1 + (width + 7) // 8) * 8)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def random_rgb(size: tuple[int, int], seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png16() -> bytes:
    ramp = (np.arange(64 * 32, dtype=np.uint32).reshape(32, 64) * 32).astype(np.uint16)  # (H, W)
    image = Image.fromarray(ramp)
    assert image.mode == "I;16"
    return encode(image, "PNG")


def palette_with_transparency() -> bytes:
    image = Image.new("P", (32, 20), 0)
    image.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)  # index 0 black, index 1 blue
    image.paste(1, (16, 0, 32, 20))
    return encode(image, "PNG", transparency=0)  # index 0 (left half) fully transparent


def gif_two_frames() -> bytes:
    first, second = Image.new("RGB", (24, 24), RED), Image.new("RGB", (24, 24), GREEN)
    return encode(first, "GIF", save_all=True, append_images=[second], duration=100)


def exif_rotated_jpeg() -> bytes:
    image = halves((64, 32), RED, BLUE)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    return encode(image, "JPEG", exif=exif, quality=95)


def truncated(data: bytes, keep: float = 0.6) -> bytes:
    return data[: int(len(data) * keep)]


def corrupt_middle(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + b"\x00" * 32 + data[middle + 32 :]


def close(actual, expected, tol: int) -> bool:
    return bool(np.all(np.abs(np.asarray(actual, dtype=int) - np.asarray(expected, dtype=int)) <= tol))


def check_rgb(size: tuple[int, int], probes: dict[tuple[int, int], tuple], tol: int = 0):
    """A checker: RGB mode, the given size, and colours at (x, y) probes within tol."""

    def check(image: Image.Image) -> None:
        assert image.mode == "RGB"
        assert image.size == size
        for (x, y), colour in probes.items():
            assert close(image.getpixel((x, y)), colour, tol), (x, y, image.getpixel((x, y)), colour)

    return check


def check_png16(image: Image.Image) -> None:
    assert image.mode == "RGB" and image.size == (64, 32)
    grey = np.asarray(image)[..., 0].astype(int)  # (H, W)
    expected = np.rint(np.arange(64 * 32).reshape(32, 64) * 32 / 257)
    assert np.abs(grey - expected).max() <= 1  # scaled, not clipped to 255
    assert grey.min() == 0 and 240 <= grey.max() <= 255 and 100 < grey.mean() < 150


# name -> (file name, bytes builder, checker for a loaded image | words the refusal must contain)
Case = tuple[str, Callable[[], bytes], Callable[[Image.Image], None] | tuple[str, ...]]
CASES: dict[str, Case] = {
    "cmyk_jpeg": ("cmyk.jpg", lambda: encode(Image.new("CMYK", (40, 30), (0, 255, 255, 0)), "JPEG"),
                  check_rgb((40, 30), {(20, 15): RED}, tol=3)),
    "progressive_jpeg": ("prog.jpg", lambda: encode(halves((64, 32), RED, BLUE), "JPEG", progressive=True, quality=95),
                         check_rgb((64, 32), {(8, 16): RED, (56, 16): BLUE}, tol=8)),
    "png_16bit": ("deep.png", png16, check_png16),
    "palette_transparency": ("pal.png", palette_with_transparency,
                             check_rgb((32, 20), {(4, 10): WHITE, (28, 10): BLUE})),
    "palette_opaque": ("pal.gif", lambda: encode(halves((32, 32), RED, GREEN).convert("P"), "PNG"),
                       check_rgb((32, 32), {(4, 4): RED, (28, 4): GREEN})),
    "greyscale_L": ("grey.png", lambda: encode(Image.new("L", (20, 20), 77), "PNG"),
                    check_rgb((20, 20), {(5, 5): (77, 77, 77)})),
    "bilevel_1": ("bits.png", lambda: encode(halves((32, 16), 0, 1, mode="1"), "PNG"),
                  check_rgb((32, 16), {(2, 2): (0, 0, 0), (30, 2): WHITE})),
    "LA_alpha": ("la.png", lambda: encode(halves((32, 16), (0, 0), (0, 255), mode="LA"), "PNG"),
                 check_rgb((32, 16), {(2, 2): WHITE, (30, 2): (0, 0, 0)})),
    "RGBA_alpha": ("rgba.png", lambda: encode(halves((32, 16), (255, 0, 0, 0), (255, 0, 0, 128), mode="RGBA"), "PNG"),
                   check_rgb((32, 16), {(2, 2): WHITE, (30, 2): (255, 127, 127)}, tol=1)),
    "gif_first_frame": ("anim.gif", gif_two_frames, check_rgb((24, 24), {(12, 12): RED})),
    "webp": ("pic.webp", lambda: encode(halves((40, 20), RED, BLUE), "WEBP", lossless=True),
             check_rgb((40, 20), {(5, 5): RED, (35, 5): BLUE})),
    "bmp": ("pic.bmp", lambda: encode(halves((40, 20), RED, BLUE), "BMP"),
            check_rgb((40, 20), {(5, 5): RED, (35, 5): BLUE})),
    "tiff": ("pic.tiff", lambda: encode(halves((40, 20), RED, BLUE), "TIFF"),
             check_rgb((40, 20), {(5, 5): RED, (35, 5): BLUE})),
    # Rotated 90° clockwise: the left (red) half ends on top, the size is swapped.
    "exif_orientation_6": ("phone.jpg", exif_rotated_jpeg,
                           check_rgb((32, 64), {(16, 8): RED, (16, 56): BLUE}, tol=10)),
    "empty": ("empty.jpg", lambda: b"", ("empty", "0 bytes", "empty.jpg")),
    "text_as_jpg": ("notes.jpg", lambda: b"Just some notes, not a picture.\n" * 5, ("not an image", "text", "notes.jpg")),
    "html_as_png": ("page.png", lambda: b"<!DOCTYPE html>\n<html><head><title>404</title></head></html>",
                    ("not an image", "HTML", "page.png")),
    "random_bytes": ("noise.jpg", lambda: np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8).tobytes(),
                     ("not an image", "noise.jpg")),
    "truncated_jpeg": ("cut.jpg", lambda: truncated(encode(random_rgb((64, 64)), "JPEG")),
                       ("truncated or corrupt", "cut.jpg")),
    "jpeg_header_only": ("stub.jpg", lambda: encode(random_rgb((64, 64)), "JPEG")[:40],
                         ("truncated or corrupt", "stub.jpg")),
    "truncated_png": ("cut.png", lambda: truncated(encode(random_rgb((64, 64)), "PNG")),
                      ("truncated or corrupt", "cut.png")),
    "corrupt_middle_png": ("bad.png", lambda: corrupt_middle(encode(random_rgb((64, 64)), "PNG")),
                           ("truncated or corrupt", "bad.png")),
    "bomb_20000": ("bomb.png", lambda: png_header_only(20_000, 20_000),
                   ("too large", "40 megapixels", "decompression", "bomb.png")),
    "bomb_8000": ("big.png", lambda: png_header_only(8_000, 8_000),
                  ("too large", "8000×8000", "40 megapixels", "big.png")),
    "one_pixel": ("dot.png", lambda: encode(Image.new("RGB", (1, 1), RED), "PNG"),
                  ("1×1", "at least 16", "dot.png")),
    "tiny_12px": ("small.png", lambda: encode(Image.new("RGB", (12, 40), RED), "PNG"), ("12×40", "at least 16")),
    "aspect_5000x10": ("strip.png", lambda: encode(Image.new("RGB", (5000, 10), RED), "PNG"),
                       ("5000×10", "aspect ratio", "strip.png")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_corpus(case: str, tmp_path: Path) -> None:
    file_name, build, expectation = CASES[case]
    path = tmp_path / file_name
    path.write_bytes(build())
    if callable(expectation):
        expectation(load_image(path))
        return
    with pytest.raises(ImageError) as caught:
        load_image(path)
    assert type(caught.value) is ImageError
    message = str(caught.value)
    for words in expectation:
        assert words in message, (words, message)
    assert "PIL" not in message and "cannot identify" not in message  # no raw Pillow text


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 20
    assert sum(not callable(expected) for _, _, expected in CASES.values()) >= 10


def test_bomb_refused_before_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_decoding(self):
        raise AssertionError("pixel data was decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    with pytest.raises(ImageError, match="too large"):
        load_image(png_header_only(8_000, 8_000))


def test_max_pixels_is_configurable() -> None:
    data = encode(Image.new("RGB", (100, 100), RED), "PNG")
    assert load_image(data, max_pixels=10_000).size == (100, 100)
    with pytest.raises(ImageError, match="9,999 pixels"):
        load_image(data, max_pixels=9_999)
    assert MAX_PIXELS == 40_000_000


def test_sources_bytes_stream_path(tmp_path: Path) -> None:
    data = encode(halves((32, 32), RED, BLUE), "PNG")
    path = tmp_path / "p.png"
    path.write_bytes(data)
    stream = io.BytesIO(data)
    stream.read(10)  # a previous reader left the position mid-file: the whole file is still used
    for source in (data, bytearray(data), str(path), path, stream, open(path, "rb")):
        image = load_image(source)
        assert image.size == (32, 32) and image.getpixel((0, 0)) == RED


def test_name_from_argument_and_stream(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="'upload.jpg' is empty"):
        load_image(b"", name="upload.jpg")
    path = tmp_path / "from_stream.jpg"
    path.write_bytes(b"plain text")
    with open(path, "rb") as handle, pytest.raises(ImageError, match="'from_stream.jpg' is not an image"):
        load_image(handle)


def test_oversized_file_refused_before_reading(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("sat_core.data.images.MAX_BYTES", 1000)
    data = encode(random_rgb((64, 64)), "PNG")
    assert len(data) > 1000
    path = tmp_path / "big.png"
    path.write_bytes(data)
    for source in (data, path, io.BytesIO(data)):
        with pytest.raises(ImageError, match="larger than"):
            load_image(source)


def test_missing_path_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="does not exist"):
        load_image(tmp_path / "nope.jpg")
    with pytest.raises(ImageError, match="is a folder"):
        load_image(tmp_path)


def test_truncated_images_stay_refused() -> None:
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


# ---- preprocess -----------------------------------------------------------------------------

def thirds(size: tuple[int, int], vertical: bool) -> Image.Image:
    """Three equal bands red | green | blue, side by side (landscape) or stacked (portrait)."""
    image = Image.new("RGB", size, RED)
    width, height = size
    if vertical:
        image.paste(GREEN, (0, height // 3, width, 2 * height // 3))
        image.paste(BLUE, (0, 2 * height // 3, width, height))
    else:
        image.paste(GREEN, (width // 3, 0, 2 * width // 3, height))
        image.paste(BLUE, (2 * width // 3, 0, width, height))
    return image


CFG = PreprocessConfig(image_size=32)


@pytest.mark.parametrize(
    "size, vertical, box",
    [((300, 100), False, (100, 0, 200, 100)), ((90, 270), True, (0, 90, 90, 180))],
    ids=["landscape", "portrait"],
)
def test_preprocess_crops_the_centre(size, vertical, box) -> None:
    image = thirds(size, vertical)
    tensor, info = preprocess(image, CFG)
    assert tensor.shape == (3, 32, 32) and tensor.dtype == torch.float32
    assert info.box == box
    assert info.scale == pytest.approx(32 / min(size))
    assert info.original_size == size and info.image_size == 32
    crop = np.asarray(crop_for_display(image, CFG))
    assert crop.shape == (32, 32, 3)
    assert np.array_equal(crop[4:-4, 4:-4], np.broadcast_to(GREEN, (24, 24, 3)))  # only the middle band
    # The display crop is exactly what the tensor encodes.
    mean, std = torch.tensor(CFG.mean).view(3, 1, 1), torch.tensor(CFG.std).view(3, 1, 1)
    pixels = ((tensor * std + mean) * 255).permute(1, 2, 0).numpy()  # (S, S, 3)
    assert np.abs(pixels - crop).max() < 1e-3


def test_preprocess_odd_offset_and_square() -> None:
    info = preprocess(Image.new("RGB", (101, 50)), CFG)[1]
    assert info.box == (25, 0, 75, 50)
    info = preprocess(Image.new("RGB", (64, 64)), CFG)[1]
    assert info == CropInfo(0, 0, 64, 64, 0.5, (64, 64), 32)


def test_preprocess_normalisation_values() -> None:
    cfg = PreprocessConfig(image_size=16, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    tensor, _ = preprocess(Image.new("RGB", (40, 20), (255, 0, 51)), cfg)
    expected = [(1.0 - 0.5) / 0.5, (0.0 - 0.25) / 0.25, (0.2 - 0.0) / 2.0]
    for channel, value in enumerate(expected):
        assert torch.allclose(tensor[channel], torch.full((16, 16), value), atol=1e-6)


def test_preprocess_downscale_is_antialiased() -> None:
    # A 1-pixel checkerboard must average to grey, not alias to black or white.
    board = (np.indices((256, 256)).sum(axis=0) % 2 * 255).astype(np.uint8)
    crop = np.asarray(crop_for_display(Image.fromarray(board).convert("RGB"), CFG)).astype(float)
    assert abs(crop.mean() - 127.5) < 3 and crop.std() < 10


def test_load_and_preprocess_returns_the_full_image(tmp_path: Path) -> None:
    path = tmp_path / "wide.png"
    path.write_bytes(encode(thirds((300, 100), vertical=False), "PNG"))
    tensor, image, info = load_and_preprocess(path, CFG)
    assert tensor.shape == (3, 32, 32)
    assert image.size == (300, 100) and image.mode == "RGB"
    assert info.box == (100, 0, 200, 100)
    with pytest.raises(ImageError, match="empty"):
        load_and_preprocess(b"", CFG)


def test_preprocess_accepts_rgba_onto_white() -> None:
    crop = crop_for_display(Image.new("RGBA", (20, 20), (0, 0, 0, 0)), PreprocessConfig(image_size=16))
    assert crop.mode == "RGB" and crop.getpixel((8, 8)) == WHITE
