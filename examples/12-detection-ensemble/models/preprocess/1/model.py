"""Detection pre-processing as a Triton Python model: images in, the detector's letterboxed input out.

IMAGE     TYPE_STRING [1]: one encoded JPEG or PNG per batch row (decoded with OpenCV, BGR), or
          TYPE_UINT8 [-1, -1, 3]: raw BGR frames, all of one request the same size.
INPUT     TYPE_FP32 [3, H, W]: letterboxed (aspect kept, grey 114 padding), RGB, / 255, CHW:
          :class:`streamrt.ops.CpuLetterbox` on CPU instances, :class:`streamrt.ops.TorchLetterbox`
          (one Triton kernel) on GPU instances, which return INPUT on the device through DLPack.
GEOMETRY  TYPE_INT32 [8]: where the picture sits in INPUT, the fields of
          :class:`streamrt.ops.LetterboxGeometry` (src_h, src_w, dst_h, dst_w, new_h, new_w, top, left);
          the post-processing step maps boxes back to frame pixels with it.

A request whose image cannot be decoded fails alone (INVALID_ARG: HTTP 400); the others of its batch
are answered.
"""

import dataclasses
import json

import numpy as np
import triton_python_backend_utils as pb_utils

from streamrt.ops import CpuLetterbox

_MAX_OPS = 16  # letterbox ops kept, one per source size


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.dst_hw = (int(params.get("input_height", "640")), int(params.get("input_width", "640")))
        output = pb_utils.get_output_config_by_name(config, "INPUT")
        if [int(d) for d in output["dims"]] != [3, *self.dst_hw]:
            raise pb_utils.TritonModelException(f"INPUT dims {output['dims']} do not match input_height/width")
        image = pb_utils.get_input_config_by_name(config, "IMAGE")
        self.encoded = image["data_type"] == "TYPE_STRING"
        self.on_gpu = args["model_instance_kind"] == "GPU"
        self.ops = {}

    def _op(self, src_hw):
        op = self.ops.get(src_hw)
        if op is None:
            if len(self.ops) >= _MAX_OPS:
                self.ops.pop(next(iter(self.ops)))
            if self.on_gpu:
                from streamrt.ops import TorchLetterbox

                op = TorchLetterbox(src_hw, self.dst_hw, device="cuda")
            else:
                op = CpuLetterbox(src_hw, self.dst_hw)
            self.ops[src_hw] = op
        return op

    def _frames(self, request):
        data = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
        if not self.encoded:
            return list(data)
        import cv2

        frames = []
        for row, item in enumerate(data.reshape(len(data), -1)[:, 0]):
            frame = cv2.imdecode(np.frombuffer(item, np.uint8), cv2.IMREAD_COLOR) if len(item) else None
            if frame is None:
                raise ValueError(f"IMAGE row {row} ({len(item)} bytes) is not a JPEG or PNG image")
            frames.append(frame)
        return frames

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                frames = self._frames(request)
            except ValueError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(self._letterbox(frames))
        return responses

    def _letterbox(self, frames):
        n, (h, w) = len(frames), self.dst_hw
        geometry = np.empty((n, 8), np.int32)
        if self.on_gpu:
            import torch

            out = torch.empty((n, 3, h, w), dtype=torch.float32, device="cuda")
            for i, frame in enumerate(frames):
                op = self._op(frame.shape[:2])
                op(torch.from_numpy(np.ascontiguousarray(frame)).cuda(), out[i])
                geometry[i] = dataclasses.astuple(op.geometry)
            image = pb_utils.Tensor.from_dlpack("INPUT", out)
        else:
            out = np.empty((n, 3, h, w), np.float32)
            for i, frame in enumerate(frames):
                op = self._op(frame.shape[:2])
                op(frame, out[i])
                geometry[i] = dataclasses.astuple(op.geometry)
            image = pb_utils.Tensor("INPUT", out)
        return pb_utils.InferenceResponse([image, pb_utils.Tensor("GEOMETRY", geometry)])
