"""Evaluation videos: frames written as an animated GIF.

Needs Pillow (the ``video`` extra, ``pip install -e
'path/to/rlplay[video]'`` from rlplay's clone, which also brings pygame-ce's
``pygame``, the renderer of Gymnasium's classic-control envs); rlplay
imports without it, and :func:`check_writer` says how to install it. One
palette of 255 colours, taken from frames spread over the episode, serves
every frame: far faster than a palette per frame (a 500-frame CartPole
episode is written in about half a second) and as exact for the few
colours of a rendered env.
"""
import os

import numpy as np

__all__ = ["check_writer", "video_path", "write_video"]

# frames sampled for the shared palette
PALETTE_FRAMES = 8


def check_writer():
    """Raise ``ImportError`` with the way to install the video writer
    unless Pillow can be imported."""
    try:
        import PIL  # noqa: F401
    except ImportError as exc:
        raise ImportError("recording evaluations needs Pillow: pip install "
                          "-e 'path/to/rlplay[video]' (rlplay's clone with "
                          "its video extra), or pip install 'pillow>=9.1' "
                          "'pygame-ce>=2.1.3'") from exc


def video_path(directory, version):
    """The file of the video of parameter version ``version``."""
    return os.path.join(os.fspath(directory), f"version-{version:06d}.gif")


def write_video(path, frames, fps):
    """Write ``frames`` (RGB arrays ``(H, W, 3)`` of one shape) as an
    animated GIF at ``fps`` frames a second, looping; atomically (a
    reader never sees half a file)."""
    from PIL import Image
    step = max(1, len(frames) // PALETTE_FRAMES)
    sample = Image.fromarray(np.concatenate(frames[::step], axis=0))
    palette = sample.quantize(colors=255, method=Image.Quantize.FASTOCTREE)
    images = [Image.fromarray(np.ascontiguousarray(frame)).quantize(
        palette=palette, dither=Image.Dither.NONE) for frame in frames]
    tmp = f"{path}.{os.getpid()}.tmp"
    images[0].save(tmp, format="GIF", save_all=True,
                   append_images=images[1:], duration=1000.0 / fps, loop=0)
    os.replace(tmp, path)
