"""Detection post-processing as a Triton Python model: raw YOLO output -> NMS'd boxes in frame pixels.

RAW         TYPE_FP32 [C, A] per image: the detector's output in the ``layout`` parameter's order
            (yolov8: 4 + num_classes channels by anchors).
GEOMETRY    TYPE_INT32 [8]: the pre-processing step's letterbox geometry of the image.
DETECTIONS  TYPE_FP32 [max_det, 6]: x1, y1, x2, y2 in frame pixels, score, class; best first, rows
            past COUNT zero. Decode + threshold + top-k + class-aware NMS are streamrt's:
            :class:`streamrt.ops.CpuPostprocess` on CPU instances, :class:`streamrt.ops.TorchPostprocess`
            (Triton kernels, no host sync) on GPU instances, which return DETECTIONS on the device.
COUNT       TYPE_INT32 [1]: valid rows.

Parameters: layout, num_classes, conf, iou, max_det, pre_nms_topk.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from streamrt.ops import CpuPostprocess, LetterboxGeometry, PostprocessConfig


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.config = PostprocessConfig(
            conf=float(params.get("conf", "0.25")), iou=float(params.get("iou", "0.45")),
            max_det=int(params.get("max_det", "100")), pre_nms_topk=int(params.get("pre_nms_topk", "1024")),
        )
        self.layout = params.get("layout", "yolov8")
        self.num_classes = int(params.get("num_classes", "80"))
        self.max_batch = max(1, int(config.get("max_batch_size", 1)))
        self.on_gpu = args["model_instance_kind"] == "GPU"
        self.cpu = CpuPostprocess(self.config, self.layout, self.num_classes)
        self.gpu_ops = {}  # one TorchPostprocess per anchor count

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW")
            geometry = pb_utils.get_input_tensor_by_name(request, "GEOMETRY")
            try:
                tensors = self._gpu(raw, geometry) if self.on_gpu else self._cpu(_host(raw), _host(geometry))
            except Exception as exc:  # a raw output of the wrong shape fails this request only
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses

    def _cpu(self, raw, geometry):
        n, m = raw.shape[0], self.config.max_det
        dets, counts = np.empty((n, m, 6), np.float32), np.empty(n, np.int32)
        self.cpu(raw, dets, counts)
        for i in range(n):
            LetterboxGeometry(*(int(v) for v in geometry[i])).to_source(dets[i, : counts[i], :4])
        return [pb_utils.Tensor("DETECTIONS", dets), pb_utils.Tensor("COUNT", counts.reshape(n, 1))]

    def _gpu(self, raw, geometry):
        import torch
        from torch.utils.dlpack import from_dlpack

        from streamrt.ops import LAYOUTS, TorchPostprocess

        raw = from_dlpack(raw.to_dlpack()).cuda()
        g = from_dlpack(geometry.to_dlpack()).cuda().float()
        n, m = raw.shape[0], self.config.max_det
        anchors = int(raw.shape[2] if LAYOUTS[self.layout].anchors_last else raw.shape[1])
        op = self.gpu_ops.get(anchors)
        if op is None:
            op = self.gpu_ops[anchors] = TorchPostprocess(self.config, self.layout, self.num_classes, anchors,
                                                          batch=self.max_batch, device="cuda")
        dets = torch.empty((n, m, 6), dtype=torch.float32, device="cuda")
        counts = torch.empty(n, dtype=torch.int32, device="cuda")
        op(raw, dets, counts)
        # LetterboxGeometry.to_source on the device: (x - left) / scale_x, clipped to the frame.
        src_h, src_w, new_h, new_w, top, left = (g[:, i].view(n, 1) for i in (0, 1, 4, 5, 6, 7))
        valid = torch.arange(m, device="cuda").view(1, m) < counts.view(n, 1)
        for axis, (offset, scale, limit) in enumerate(((left, new_w / src_w, src_w), (top, new_h / src_h, src_h))):
            for column in (axis, axis + 2):
                mapped = torch.minimum(((dets[..., column] - offset) / scale).clamp(min=0), limit)
                dets[..., column] = torch.where(valid, mapped, dets[..., column])
        return [pb_utils.Tensor.from_dlpack("DETECTIONS", dets),
                pb_utils.Tensor.from_dlpack("COUNT", counts.view(n, 1))]


def _host(tensor):
    if tensor.is_cpu():
        return tensor.as_numpy()
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack()).cpu().numpy()
