"""``RecordVideo`` that writes its mp4 files with imageio, so every captured frame is in the file.

Why: gymnasium's ``RecordVideo`` writes through moviepy, and moviepy 2.x counts a
clip's frames as ``int(duration * fps)`` with ``duration = n / fps``, which
rounds down for some lengths (11 to 14 frames at 50 fps lose their last frame).
``envrunners evaluate --video`` promises one frame per step plus the reset frame.
"""

from __future__ import annotations

import gc
import os

import gymnasium as gym
import numpy as np

__all__ = ["ExactFramesRecordVideo"]


class ExactFramesRecordVideo(gym.wrappers.RecordVideo):
    """``gym.wrappers.RecordVideo`` (same arguments) whose videos hold every captured frame.

    A video of an episode has its reset frame and one frame per step. Frames are
    encoded with imageio's ffmpeg plugin (H.264, ``yuv420p``).
    """

    def stop_recording(self) -> None:
        """Write the captured frames to ``<video_folder>/<name>.mp4`` and stop recording."""
        assert self.recording, "stop_recording was called, but no recording was started"
        if self.recorded_frames:
            import imageio.v3 as iio

            path = os.path.join(self.video_folder, f"{self._video_name}.mp4")
            iio.imwrite(
                path,
                np.stack(self.recorded_frames),
                plugin="FFMPEG",
                fps=self.frames_per_sec,
                codec="libx264",
                macro_block_size=2,  # yuv420p needs even sizes; others are kept as they are
            )
        self.recorded_frames = []
        self.recording = False
        self._video_name = None
        if self.gc_trigger and self.gc_trigger(self.episode_id):
            gc.collect()
