"""Real-time object detection on video: sources, the detection pipeline, sinks and run reports.

Example:
    >>> from streamrt.video import DetectConfig, open_detector, open_source, run_detection, bundled_model
    >>> detector = open_detector(bundled_model())                               # doctest: +SKIP
    >>> report = run_detection(detector, [open_source("synthetic")], DetectConfig())  # doctest: +SKIP
    >>> print(report.format_text())                                              # doctest: +SKIP

OpenCV (the ``video`` extra) decodes, draws and encodes; the detector itself runs on any
StreamRT backend. See ``docs/detection.md``.
"""

from __future__ import annotations

from streamrt.video import decoding as _decoding  # noqa: F401 - registers the decoders with open_source
from streamrt.video.model import DetectorModel, best_backend, bundled_labels, bundled_model, open_detector
from streamrt.video.report import RunReport, write_report_files
from streamrt.video.runner import DetectConfig, run_detection
from streamrt.video.sinks import JsonlSink, ThreadedSink, VideoSink, annotate
from streamrt.video.sources import (
    ArraySource,
    FrameSource,
    ImageFolderSource,
    Prefetch,
    SourceError,
    SourceInfo,
    SyntheticSource,
    VideoFileSource,
    open_source,
)
from streamrt.video.synthetic import CLASS_NAMES, GroundTruth, SyntheticClip
from streamrt.video.workload import Detections, DetectionWorkload, Frame

__all__ = [
    "CLASS_NAMES",
    "ArraySource",
    "DetectConfig",
    "DetectionWorkload",
    "Detections",
    "DetectorModel",
    "Frame",
    "FrameSource",
    "GroundTruth",
    "ImageFolderSource",
    "JsonlSink",
    "Prefetch",
    "RunReport",
    "SourceError",
    "SourceInfo",
    "SyntheticClip",
    "SyntheticSource",
    "ThreadedSink",
    "VideoFileSource",
    "VideoSink",
    "annotate",
    "best_backend",
    "bundled_labels",
    "bundled_model",
    "open_detector",
    "open_source",
    "run_detection",
    "write_report_files",
]
