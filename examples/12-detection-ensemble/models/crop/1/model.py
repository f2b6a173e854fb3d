"""The crop step as a Triton Python model: detections in frame pixels -> fixed-size crops for a classifier.

PIXELS      TYPE_FP32 [3, H, W]: the detector's letterboxed input (from the pre-processing step).
GEOMETRY    TYPE_INT32 [8]: its letterbox geometry (:class:`streamrt.ops.LetterboxGeometry` fields).
DETECTIONS  TYPE_FP32 [max_det, 6]: the post-processing step's boxes in frame pixels (x1, y1, x2, y2, ...).
COUNT       TYPE_INT32 [1]: valid rows of DETECTIONS.
CROPS       TYPE_FP32 [max_det, 3, crop_height, crop_width]: each box mapped back into PIXELS and cut
            out by :func:`streamrt.ops.crop_resize` (bilinear, torch: on the device on GPU instances,
            which hand CROPS on through DLPack); rows past COUNT are zero.
VALID       TYPE_FP32 [max_det]: 1 for rows below COUNT, else 0 (the classifier zeroes the others' scores).

A request whose tensors do not agree fails alone (INVALID_ARG).
"""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.size = (int(params.get("crop_height", "32")), int(params.get("crop_width", "32")))
        crops = pb_utils.get_output_config_by_name(config, "CROPS")
        if [int(d) for d in crops["dims"]][2:] != list(self.size):
            raise pb_utils.TritonModelException(f"CROPS dims {crops['dims']} do not match crop_height/width")
        self.device = "cuda" if args["model_instance_kind"] == "GPU" else "cpu"

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                pixels, detections, count = (_torch(pb_utils.get_input_tensor_by_name(request, name), self.device)
                                             for name in ("PIXELS", "DETECTIONS", "COUNT"))
                geometry = _torch(pb_utils.get_input_tensor_by_name(request, "GEOMETRY"), "cpu")
                bad = (geometry[:, :6] <= 0).any(dim=1).nonzero().flatten().tolist()  # sizes, on the host
                if bad:
                    raise ValueError(f"GEOMETRY row {bad[0]} {geometry[bad[0]].tolist()} is not a letterbox geometry "
                                     "(its sizes must be > 0)")
                tensors = self._crop(pixels, geometry.to(self.device), detections, count)
            except Exception as exc:  # tensors that do not agree fail this request only
                error = pb_utils.TritonError(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses

    def _crop(self, pixels, geometry, detections, count):
        import torch

        from streamrt.ops import crop_resize

        n = pixels.shape[0]
        if geometry.shape != (n, 8) or detections.dim() != 3 or detections.shape[2] < 4 or count.numel() != n:
            raise ValueError(f"PIXELS {list(pixels.shape)}, GEOMETRY {list(geometry.shape)}, DETECTIONS "
                             f"{list(detections.shape)} and COUNT {list(count.shape)} do not describe {n} images")
        g = geometry.float()
        # frame pixels -> letterbox pixels: x * new_w / src_w + left (LetterboxGeometry.to_source inverted)
        scale_x, scale_y = (g[:, 5] / g[:, 1]).view(n, 1), (g[:, 4] / g[:, 0]).view(n, 1)
        left, top = g[:, 7].view(n, 1), g[:, 6].view(n, 1)
        boxes = detections[..., :4].float()
        boxes = torch.stack([boxes[..., 0] * scale_x + left, boxes[..., 1] * scale_y + top,
                             boxes[..., 2] * scale_x + left, boxes[..., 3] * scale_y + top], dim=-1)
        counts = count.view(n).to(torch.int64)
        crops = crop_resize(pixels.float(), boxes, counts, self.size)
        valid = (torch.arange(boxes.shape[1], device=pixels.device).view(1, -1) < counts.view(n, 1)).float()
        if self.device == "cuda":
            return [pb_utils.Tensor.from_dlpack("CROPS", crops), pb_utils.Tensor.from_dlpack("VALID", valid)]
        return [pb_utils.Tensor("CROPS", crops.numpy()), pb_utils.Tensor("VALID", valid.numpy())]


def _torch(tensor, device):
    import torch
    from torch.utils.dlpack import from_dlpack

    if tensor.is_cpu():
        return torch.from_numpy(tensor.as_numpy()).to(device)
    return from_dlpack(tensor.to_dlpack()).to(device)
