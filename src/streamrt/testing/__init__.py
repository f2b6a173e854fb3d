"""Test doubles and demo workloads that ship with StreamRT (benchmarks, tests and demos use them).

``models``: tiny ONNX models with NumPy references; ``yolo``: a YOLO-shaped detector for video
demos; ``workloads``: the frames-in, CNN, top-k-out pipeline workload and a torch-module engine.
Nothing below ``testing`` in the layers imports it.
"""
