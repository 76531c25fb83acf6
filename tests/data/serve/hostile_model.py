"""A Triton Python-backend model that answers like a broken or foreign server (for the client's tests).

The config's ``mode`` parameter picks how each reply is wrong; the replies are otherwise shaped like
pointpillars-trt's (one box of class 0 per request).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.mode = config["parameters"]["mode"]["string_value"]

    def execute(self, requests):
        return [self._reply() for _ in requests]

    def _reply(self):
        arrays = {"boxes": np.ones((1, 1, 7), np.float32), "scores": np.full((1, 1), 0.5, np.float32),
                  "labels": np.zeros((1, 1), np.int32)}
        arrays.update({name: np.ones((1, 1), np.int32)
                       for name in ("num_points", "num_nonfinite", "num_pillars", "num_pillars_dropped")})
        if self.mode == "missing_labels":
            del arrays["labels"]
        elif self.mode == "boxes_of_five":
            arrays["boxes"] = np.ones((1, 1, 5), np.float32)
        elif self.mode == "label_out_of_range":
            arrays["labels"] = np.full((1, 1), 7, np.int32)
        elif self.mode == "scores_as_int":
            arrays["scores"] = np.ones((1, 1), np.int32)
        elif self.mode == "negative_count":
            arrays["num_points"] = np.full((1, 1), -5, np.int32)
        elif self.mode == "score_above_one":
            arrays["scores"] = np.full((1, 1), 5.0, np.float32)
        elif self.mode == "negative_size":
            arrays["boxes"][0, 0, 3] = -1.0
        tensors = [pb_utils.Tensor.from_dlpack(name, np.ascontiguousarray(value)) for name, value in arrays.items()]
        return pb_utils.InferenceResponse(output_tensors=tensors)
