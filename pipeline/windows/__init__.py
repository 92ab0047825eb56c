"""Event-time windows: watermark tracking, window assignment and the window aggregation step.

Pure, vectorised pyarrow kernels; the semantics are in ``docs/windows.md``.
"""
from pipeline.windows.aggregate import EmitMode, WindowSpec, WindowStepResult, window_step
from pipeline.windows.assign import assign_windows, last_window_start
from pipeline.windows.session import session_step
from pipeline.windows.watermark import WatermarkState, observe_channels

__all__ = ["EmitMode", "WindowSpec", "WindowStepResult", "window_step", "assign_windows", "last_window_start",
           "WatermarkState", "observe_channels", "session_step"]
