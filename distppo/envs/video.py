"""MP4 recording of env 0's full games (`--capture-video`, `distppo eval --video`).

H.264 (libx264, yuv420p, moov atom first): what browsers, W&B's media panel and GitHub play.
OpenCV's wheels encode MPEG-4 Part 2 (`mp4v`) only, which they do not, so the frames go to the
ffmpeg binary that imageio-ffmpeg ships (a static build with libx264; the train extra)."""
from __future__ import annotations

import importlib.util
import os
from typing import Generator, Optional

import numpy as np

from distppo.errors import ConfigError, install_hint

NO_ENCODER = ("videos need the imageio-ffmpeg package (an H.264 encoder): "
              f"{install_hint('train')}, or drop --capture-video / --video")


def check_encoder() -> None:
    """Before a run starts: the H.264 encoder is installed (a one-line fix)."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        raise ConfigError(NO_ENCODER)


def _ffmpeg():
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ConfigError(NO_ENCODER) from None
    return imageio_ffmpeg


class VideoRecorder:
    """Writes RGB frames to `<folder>/episode-<k>.mp4`, one file per full game."""

    def __init__(self, folder: str, fps: float):
        self._ffmpeg = _ffmpeg()  # before any frame: a missing encoder is a one-line error
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.fps = float(fps)
        self.episode = 0
        self._writer: Optional[Generator] = None

    def add(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.ndim == 4:   # EnvPool renders [1, H, W, 3]
            frame = frame[0]  # [1, H, W, 3] -> [H, W, 3]
        if self._writer is None:
            path = os.path.join(self.folder, f"episode-{self.episode}.mp4")
            h, w = frame.shape[:2]
            # yuv420p halves the chroma planes: even sizes (Atari's 210 x 160, classic
            # control's 400 x 600) pass unchanged; macro_block_size=2 pads an odd one
            self._writer = self._ffmpeg.write_frames(
                path, (w, h), fps=self.fps, codec="libx264", pix_fmt_in="rgb24",
                pix_fmt_out="yuv420p", macro_block_size=2, ffmpeg_log_level="error",
                output_params=["-movflags", "+faststart"])
            self._writer.send(None)  # starts ffmpeg
        self._writer.send(np.ascontiguousarray(frame, dtype=np.uint8))

    def end_episode(self) -> None:
        if self._writer is not None:
            self._writer.close()  # ffmpeg writes the index and exits
            self._writer = None
            self.episode += 1

    def close(self) -> None:
        """Closes (keeps) the partial video of an unfinished game."""
        self.end_episode()
