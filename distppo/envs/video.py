"""MP4 recording of env 0's full games (`--capture-video`, `distppo eval --video`)."""
from __future__ import annotations

import os
from typing import Optional

import cv2
import numpy as np


class VideoRecorder:
    """Writes RGB frames to `<folder>/episode-<k>.mp4`, one file per full game."""

    def __init__(self, folder: str, fps: float):
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.fps = float(fps)
        self.episode = 0
        self._writer: Optional[cv2.VideoWriter] = None

    def add(self, frame: np.ndarray) -> None:
        frame = np.asarray(frame)
        if frame.ndim == 4:   # EnvPool renders [1, H, W, 3]
            frame = frame[0]  # [1, H, W, 3] -> [H, W, 3]
        if self._writer is None:
            path = os.path.join(self.folder, f"episode-{self.episode}.mp4")
            h, w = frame.shape[:2]
            self._writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (w, h))
            if not self._writer.isOpened():
                raise RuntimeError(f"OpenCV cannot write {path} with the mp4v codec")
        self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))

    def end_episode(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None
            self.episode += 1

    def close(self) -> None:
        """Closes (keeps) the partial video of an unfinished game."""
        self.end_episode()
