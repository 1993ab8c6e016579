"""THE image loader: every image the app, the CLI and the datasets read goes through ``load_image``.

``load_image`` turns whatever Pillow can read into an RGB ``PIL.Image`` (EXIF orientation applied,
alpha composited onto white, 16-bit scaled to 8-bit) or raises ``ImageError`` with a message that
says what is wrong and what to do. ``preprocess`` turns that image into the encoder's input and
records exactly which part of the original image the encoder saw (``CropInfo``), so attention maps
can be laid over the right pixels.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Union

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from sat_core.config import PreprocessConfig
from sat_core.errors import ImageError

MAX_PIXELS = 40_000_000  # refuse larger images before decoding them (decompression bombs)
MAX_BYTES = 64 * 1024 * 1024  # refuse larger files before reading them into memory
MAX_ASPECT = 20.0  # longer side / shorter side
MIN_SIDE = 16  # pixels

ImageSource = Union[str, Path, bytes, bytearray, memoryview, BinaryIO]

# Leading bytes of the formats we accept: a file that starts like an image but cannot be
# identified is damaged, not "some other kind of file".
_MAGIC = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"BM",
    b"II*\x00",  # TIFF, little-endian
    b"MM\x00*",  # TIFF, big-endian
)
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}


@dataclass(frozen=True)
class CropInfo:
    """Which square of the original image the encoder saw, in original pixel coordinates.

    The encoder input is the box (left, top, right, bottom) resized to image_size × image_size,
    so encoder pixel (x, y) corresponds to original pixel (left + x / scale, top + y / scale).
    """

    left: int
    top: int
    right: int
    bottom: int
    scale: float  # encoder pixels per original pixel
    original_size: tuple[int, int]  # (width, height) of the image given to preprocess
    image_size: int  # S

    @property
    def box(self) -> tuple[int, int, int, int]:
        return (self.left, self.top, self.right, self.bottom)


def load_image(
    source: ImageSource, *, name: str | None = None, max_pixels: int = MAX_PIXELS
) -> Image.Image:
    """Read an image file, bytes or binary stream into a fully decoded RGB image.

    Raises ImageError (never a raw Pillow error) for missing, empty, non-image, truncated or
    corrupt files, for images over ``max_pixels``, wider than 20:1, or smaller than 16 px a side.
    """
    data, name = _read_source(source, name)
    label = f"The image {name!r}" if name else "The image"
    if not data:
        raise ImageError(f"{label} is empty (0 bytes). Choose a non-empty JPEG or PNG file.")
    image = _open(data, label, max_pixels)
    _check_size(image.size, label, max_pixels)
    _decode(image, label)
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:  # a damaged EXIF block should not lose an otherwise good image
        pass
    return _to_rgb(image, label)


def _read_source(source: ImageSource, name: str | None) -> tuple[bytes, str | None]:
    """Return the file's bytes and the best name for messages."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) > MAX_BYTES:
            raise ImageError(_too_many_bytes(name))
        return bytes(source), name
    if isinstance(source, (str, Path)):
        path = Path(source)
        name = name or path.name
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise ImageError(f"The image file {str(path)!r} {what}. Check the path.")
        if path.stat().st_size > MAX_BYTES:
            raise ImageError(_too_many_bytes(name))
        try:
            return path.read_bytes(), name
        except OSError as exc:
            raise ImageError(f"The image file {str(path)!r} cannot be read ({exc.strerror}).") from exc
    name = name or Path(str(getattr(source, "name", "") or "")).name or None
    # Streamlit's UploadedFile and BytesIO hold the whole file: take all of it, wherever the
    # read position was left by an earlier reader.
    data = source.getvalue() if hasattr(source, "getvalue") else source.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ImageError(_too_many_bytes(name))
    return bytes(data), name


def _too_many_bytes(name: str | None) -> str:
    label = f"The image {name!r}" if name else "The image"
    return f"{label} is larger than {MAX_BYTES // 2**20} MB. Resize or recompress it first."


def _open(data: bytes, label: str, max_pixels: int) -> Image.Image:
    """Identify the format and read the header only (no pixel data decoded yet)."""
    try:
        # Pillow's own bomb check warns between its limit and twice it; ours is stricter anyway.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageError(_bomb_message(label, None, max_pixels)) from exc
    except UnidentifiedImageError as exc:
        if _looks_like_image(data):
            raise ImageError(_corrupt_message(label)) from exc
        raise ImageError(_not_image_message(data, label)) from exc
    except Exception as exc:  # headers cut short raise OSError, SyntaxError, struct.error …
        raise ImageError(_corrupt_message(label)) from exc


def _check_size(size: tuple[int, int], label: str, max_pixels: int) -> None:
    """Refuse by header size, before any pixel data is decoded."""
    width, height = size
    if width * height > max_pixels:
        raise ImageError(_bomb_message(label, size, max_pixels))
    if min(width, height) > 0 and max(width, height) / min(width, height) > MAX_ASPECT:
        raise ImageError(
            f"{label} is {width}×{height} pixels, an aspect ratio over {MAX_ASPECT:g}:1; "
            "the model needs a roughly square photo. Crop it to the part you want captioned."
        )
    if min(width, height) < MIN_SIDE:
        raise ImageError(
            f"{label} is only {width}×{height} pixels; each side must be at least {MIN_SIDE} "
            "pixels. Use a larger image."
        )


def _decode(image: Image.Image, label: str) -> None:
    """Force a full decode so truncated or corrupt files fail here, not later."""
    # ImageFile.LOAD_TRUNCATED_IMAGES must stay False (Pillow's default): when True, Pillow pads
    # a truncated file with grey instead of failing. Nothing in this project sets it.
    try:
        image.load()
    except Exception as exc:
        raise ImageError(_corrupt_message(label)) from exc


def _to_rgb(image: Image.Image, label: str) -> Image.Image:
    """Convert any decoded mode to RGB without losing the picture (alpha → white background)."""
    mode = image.mode
    if mode == "RGB":
        return image
    try:
        if mode in _SIXTEEN_BIT or mode in ("I", "F"):
            return _high_depth_to_rgb(image)
        if mode in _ALPHA_MODES or "transparency" in image.info:
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        return image.convert("RGB")  # L, 1, P, CMYK, YCbCr, HSV …
    except Exception as exc:
        raise ImageError(
            f"{label} uses the colour mode {mode!r}, which cannot be converted to RGB. "
            "Save it as an 8-bit RGB JPEG or PNG."
        ) from exc


def _high_depth_to_rgb(image: Image.Image) -> Image.Image:
    """Scale 16-bit / 32-bit / float greyscale to 8 bits instead of clipping it to white."""
    values = np.asarray(image).astype(np.float64)  # (H, W)
    if image.mode in _SIXTEEN_BIT:
        values = values / 257.0  # 65535 → 255
    elif image.mode == "F" and values.size and values.max() <= 1.0:
        values = values * 255.0  # floats in [0, 1]
    elif image.mode == "I" and values.size and values.max() > 255:
        values = values / 257.0 if values.max() <= 65535 else values * (255.0 / values.max())
    grey = np.clip(np.rint(values), 0, 255).astype(np.uint8)
    return Image.fromarray(grey).convert("RGB")


def _looks_like_image(data: bytes) -> bool:
    return data.startswith(_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


def _not_image_message(data: bytes, label: str) -> str:
    head = data[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<?xml", b"<svg")) or b"<html" in head:
        kind = "an HTML/XML page (perhaps a web page saved under an image name)"
    elif _is_text(data[:4096]):
        kind = "a text file"
    else:
        kind = "not in an image format Pillow can read"
    return (
        f"{label} is not an image: its content is {kind}. "
        "Choose a JPEG, PNG, GIF, WebP, BMP or TIFF file."
    )


def _is_text(chunk: bytes) -> bool:
    try:
        chunk.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(b >= 32 or b in (9, 10, 13) for b in chunk)


def _corrupt_message(label: str) -> str:
    return (
        f"{label} is truncated or corrupt: its pixel data cannot be decoded completely. "
        "Download or export it again."
    )


def _bomb_message(label: str, size: tuple[int, int] | None, max_pixels: int) -> str:
    dims = f"{size[0]}×{size[1]} pixels" if size else "larger than Pillow's safety limit"
    return (
        f"{label} is too large ({dims}); the limit is {max_pixels / 1e6:g} megapixels "
        f"({max_pixels:,} pixels), to protect against decompression bombs. "
        "Downscale it before uploading."
    )


def _crop_geometry(size: tuple[int, int], image_size: int, crop: float = 1.0) -> CropInfo:
    """The centred square of side crop·min(w, h): what 'resize short side, centre-crop' keeps."""
    width, height = size
    side = max(1, round(min(width, height) * crop))
    left, top = (width - side) // 2, (height - side) // 2
    return CropInfo(left, top, left + side, top + side, image_size / side, (width, height), image_size)


def crop_info(size: tuple[int, int], cfg: PreprocessConfig) -> CropInfo:
    """Where ``preprocess`` crops an image of ``size`` (W, H), without the image (an object mask's size)."""
    return _crop_geometry(size, cfg.image_size, cfg.crop)


def crop_for_display(image: Image.Image, cfg: PreprocessConfig) -> Image.Image:
    """The S×S RGB image the encoder sees (same geometry and resampling as ``preprocess``)."""
    return _resized_crop(image, cfg)[0]


def _resized_crop(image: Image.Image, cfg: PreprocessConfig) -> tuple[Image.Image, CropInfo]:
    if image.mode != "RGB":
        image = _to_rgb(image, "The image")
    info = _crop_geometry(image.size, cfg.image_size, cfg.crop)
    # Resizing only the crop box is the same as resizing the short side then cropping,
    # and Pillow's bicubic filter widens its support when shrinking (antialiasing).
    crop = image.resize((cfg.image_size, cfg.image_size), Image.Resampling.BICUBIC, box=info.box)
    return crop, info


def resized_pixels(image: Image.Image, cfg: PreprocessConfig) -> np.ndarray:
    """The S×S crop the encoder sees as uint8 (3, S, S): ``preprocess``'s pixels before normalising (what the
    image stores keep; a quarter of float32's bytes, and no rounding: ``normalise`` gives ``preprocess``'s values)."""
    crop, _info = _resized_crop(image, cfg)
    return np.ascontiguousarray(np.asarray(crop, dtype=np.uint8).transpose(2, 0, 1))  # (S, S, 3) -> (3, S, S)


def preprocess(image: Image.Image, cfg: PreprocessConfig) -> tuple[torch.Tensor, CropInfo]:
    """RGB image -> normalised float32 tensor (3, S, S) and where the crop lies in the image."""
    crop, info = _resized_crop(image, cfg)
    pixels = torch.from_numpy(np.asarray(crop, dtype=np.float32) / 255.0)  # (S, S, 3)
    pixels = pixels.permute(2, 0, 1).contiguous()  # (3, S, S)
    mean = torch.tensor(cfg.mean, dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(cfg.std, dtype=torch.float32).view(3, 1, 1)
    return (pixels - mean) / std, info


def load_and_preprocess(
    source: ImageSource,
    cfg: PreprocessConfig,
    *,
    name: str | None = None,
    max_pixels: int = MAX_PIXELS,
) -> tuple[torch.Tensor, Image.Image, CropInfo]:
    """``load_image`` then ``preprocess``: (tensor (3, S, S), the full RGB image, its CropInfo)."""
    image = load_image(source, name=name, max_pixels=max_pixels)
    tensor, info = preprocess(image, cfg)
    return tensor, image, info
