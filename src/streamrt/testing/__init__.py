"""Test doubles and demo workloads that ship with StreamRT (benchmarks, tests and demos use them).

``models``: tiny ONNX models with NumPy references; ``yolo``: a YOLO-shaped detector for video
demos; ``workloads``: the frames-in, CNN, top-k-out pipeline workload and a torch-module engine;
``triton_examples``: the models NVIDIA's Triton client examples expect, as a model repository.
Nothing below ``testing`` in the layers imports it.
"""
