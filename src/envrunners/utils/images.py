"""Image helpers for pixel envs: RGB to grayscale and area resize, as RLlib computes them.

RLlib's Atari wrappers convert frames with OpenCV (``COLOR_RGB2GRAY``, ``INTER_AREA``).
The same calls are used here, so a wrapped frame is pixel-identical to RLlib's; a
numpy re-implementation was measured 3-10x slower per frame and off by one grey level
on some pixels. OpenCV comes with the ``atari`` extra (``opencv-python-headless``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["resize", "rgb2gray"]

_INSTALL_HINT = (
    "OpenCV is needed to convert image frames (grayscale, resize): "
    'pip install "envrunners[atari]" (or pip install opencv-python-headless).'
)


_loaded: list[Any] = []


def _cv2() -> Any:
    """The cv2 module, imported once on first use so importing this module stays cheap."""
    if not _loaded:
        try:
            import cv2
        except ImportError as err:
            raise ModuleNotFoundError(_INSTALL_HINT) from err
        # OpenCL dispatch only adds overhead for frames this small.
        cv2.ocl.setUseOpenCL(False)
        _loaded.append(cv2)
    return _loaded[0]


def resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """``img`` resized to ``height`` x ``width`` by pixel-area averaging (OpenCV INTER_AREA)."""
    cv2 = _cv2()
    return cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)


def rgb2gray(img: np.ndarray) -> np.ndarray:
    """An ``(H, W, 3)`` RGB image as ``(H, W)`` luminance (OpenCV COLOR_RGB2GRAY)."""
    cv2 = _cv2()
    return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
