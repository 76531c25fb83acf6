"""A Triton Python-backend model that answers like a broken, foreign or slow server (for the client's tests).

The config's ``mode`` parameter picks how each reply is wrong; the replies are otherwise shaped like
pointpillars-trt's (one box of class 0 per request). Mode ``sleeps`` answers rightly for a frame of one point, as
many seconds late as the point's x says, each request through its response sender from a timer of its own: a
late request holds up neither the instance nor the requests after it.
"""

import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.mode = config["parameters"]["mode"]["string_value"]

    def execute(self, requests):
        if self.mode != "sleeps":
            return [self._reply() for _ in requests]
        for request in requests:
            seconds = float(pb_utils.get_input_tensor_by_name(request, "points").as_numpy().reshape(-1)[0])
            timer = threading.Timer(seconds, request.get_response_sender().send, (self._reply(),),
                                    {"flags": pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL})
            timer.daemon = True
            timer.start()
        return None

    def _reply(self):
        arrays = {"boxes": np.ones((1, 1, 7), np.float32), "scores": np.full((1, 1), 0.5, np.float32),
                  "labels": np.zeros((1, 1), np.int32)}
        arrays.update({name: np.ones((1, 1), np.int32)
                       for name in ("num_points", "num_nonfinite", "num_pillars", "num_pillars_dropped",
                                    "num_overflowed_scores", "num_overflowed_features")})
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
