"""load_image: an API image reference -> a decoded RGB PIL image, or ValueError saying what is wrong.

Accepted: PIL images, raw bytes, `data:image/...;base64,...` URLs, bare base64 strings, and local file paths
(plain or file://) inside --allowed-local-media-path. Remote http(s) URLs are not fetched. media_bytes() does the
same for videos (video_loader.py) and audio.
The HTTP layer maps ValueError to 400, so every message names the problem and the limit.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
import struct
from typing import Any, Optional, Tuple

from PIL import Image

# named in the 400 for bytes PIL does not recognise (it reads more, these are what clients send)
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "WebP", "BMP", "TIFF")
# Decoded images larger than this are refused before any resize (decompression bombs): 8192 x 8192.
MAX_DECODED_IMAGE_PIXELS = 8192 * 8192


# base64 is decoded in slices of this many characters (a multiple of 4): binascii holds the GIL for a whole call,
# so a 32 MiB body decoded at once would hold every other thread (the HTTP loop) for ~100 ms; a slice takes ~10 ms.
B64_SLICE_CHARS = 4 << 20


def _decode_base64(data: str, kind: str = "image") -> bytes:
    if any(ws in data for ws in (" ", "\n", "\r", "\t")):  # each a memchr-speed scan
        data = "".join("".join(data[i:i + B64_SLICE_CHARS].split()) for i in range(0, len(data), B64_SLICE_CHARS))
    if not data:
        raise ValueError(f"The {kind}'s base64 data is empty.")
    data += "=" * (-len(data) % 4)
    try:
        return b"".join(base64.b64decode(data[i:i + B64_SLICE_CHARS], validate=True)
                        for i in range(0, len(data), B64_SLICE_CHARS))
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"The {kind} is not valid base64: {e}.") from e


_OBJECT_REPR = re.compile(r"\s*<[^<>]*\bat 0x[0-9a-fA-F]+>")


def decode_error_words(e: BaseException) -> str:
    """A decoder's exception as words for a 400: without the Python object reprs (`<_io.BytesIO object at 0x..>`)
    PIL and libsndfile put in their messages."""
    text = _OBJECT_REPR.sub("", str(e)).strip().rstrip(":").strip()
    return text or type(e).__name__


def _read_local(path: str, allowed_dir: Optional[str], kind: str = "image") -> bytes:
    if allowed_dir is None:
        raise ValueError(f"Local {kind} paths are not allowed on this server (start it with "
                         "--allowed-local-media-path).")
    real = os.path.realpath(path)
    root = os.path.realpath(allowed_dir)
    if os.path.commonpath([real, root]) != root:
        raise ValueError(f"The {kind} path {path!r} is outside the allowed media directory.")
    if not os.path.isfile(real):
        raise ValueError(f"The {kind} file {path!r} does not exist.")
    with open(real, "rb") as f:
        return f.read()


# media type prefix a data URL of each kind must have
_DATA_URL_TYPES = {"image": "image/", "video": "video/", "audio": "audio/"}
_DATA_URL_EXAMPLES = {"image": "image/png", "video": "video/mp4", "audio": "audio/wav"}
# "<scheme>://": base64's alphabet has no ':', so a bare base64 string never matches
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def media_bytes(item: Any, allowed_local_media_path: Optional[str] = None, kind: str = "image") -> bytes:
    """The raw bytes of an API media reference of `kind` ("image", "video", "audio")."""
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    if isinstance(item, dict) and "url" in item:  # {"url": ...} as in OpenAI's image_url object
        item = item["url"]
    if not isinstance(item, str):
        raise ValueError(f"Unsupported {kind} input of type {type(item).__name__}; send a data URL or base64 string.")
    s = item.strip()
    if s.startswith("data:"):
        header, sep, payload = s.partition(",")
        want = _DATA_URL_TYPES[kind]
        if not sep or ";base64" not in header:
            raise ValueError(f"The {kind} data URL must look like 'data:{_DATA_URL_EXAMPLES[kind]};base64,<data>'.")
        if not header[5:].startswith(want):
            raise ValueError(f"The data URL has media type {header[5:].split(';')[0]!r}; a {want}* type is required.")
        return _decode_base64(payload, kind)
    if s.startswith(("http://", "https://")):
        raise ValueError(f"Remote {kind} URLs are not fetched by this server; send the {kind} as a base64 data URL.")
    scheme = _URL_SCHEME.match(s)
    if scheme and scheme.group(1).lower() != "file":
        raise ValueError(f"The {kind} URL scheme {scheme.group(1)!r} is not supported; send a data URL "
                         f"('data:{_DATA_URL_EXAMPLES[kind]};base64,<data>'), bare base64, or a file:// path under "
                         "--allowed-local-media-path.")
    if s.startswith("file://"):
        return _read_local(s[len("file://"):], allowed_local_media_path, kind)
    if s.startswith("/") or s.startswith("./"):
        return _read_local(s, allowed_local_media_path, kind)
    return _decode_base64(s, kind)


def image_bytes(item: Any, allowed_local_media_path: Optional[str] = None) -> bytes:
    return media_bytes(item, allowed_local_media_path, "image")


def _declared_size(data: bytes) -> Optional[Tuple[int, int]]:
    """(width, height) from a PNG/GIF header, so a zero-size image is named as such (PIL only says 'cannot
    identify' for those)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    return None


def load_image(item: Any, allowed_local_media_path: Optional[str] = None) -> Image.Image:
    """Decode and validate one image (RGB). Raises ValueError for anything that is not a usable image."""
    if isinstance(item, Image.Image):
        img = item
    else:
        data = image_bytes(item, allowed_local_media_path)
        if not data:
            raise ValueError("The image data is empty.")
        declared = _declared_size(data)
        if declared is not None and 0 in declared:
            raise ValueError(f"The image has zero size ({declared[0]}x{declared[1]}).")
        try:
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            if w * h > MAX_DECODED_IMAGE_PIXELS:
                raise ValueError(f"The image is {w}x{h} = {w * h:,} pixels; at most {MAX_DECODED_IMAGE_PIXELS:,} "
                                 "pixels are accepted. Downscale it before sending.")
            img.load()
        except ValueError:
            raise
        except Image.UnidentifiedImageError as e:
            raise ValueError(f"The image data could not be decoded as an image: it is not in a format this server "
                             f"reads ({', '.join(IMAGE_FORMATS)}); its first bytes are {data[:8].hex(' ')}.") from e
        except (OSError, SyntaxError, Image.DecompressionBombError) as e:  # truncated or corrupt pixel data
            raise ValueError(f"The image data could not be decoded as an image ({decode_error_words(e)}).") from e
    w, h = img.size
    if w <= 0 or h <= 0:
        raise ValueError(f"The image has zero size ({w}x{h}).")
    if w * h > MAX_DECODED_IMAGE_PIXELS:
        raise ValueError(f"The image is {w}x{h} = {w * h:,} pixels; at most {MAX_DECODED_IMAGE_PIXELS:,} pixels "
                         "are accepted. Downscale it before sending.")
    return img.convert("RGB") if img.mode != "RGB" else img
