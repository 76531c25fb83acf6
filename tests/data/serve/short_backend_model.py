"""pointpillars-trt's served model (apps/serve/triton_model.py) on a Python-backend stub that falls short, as its
config's ``falls_short`` parameter says (for the tests of the model's fallbacks):

- ``metrics``: a stub without custom metrics (before Triton 23.03 it has no ``pb_utils.MetricFamily``);
- ``sends``: a stub that refuses every answer the model sends. Each request's response sender sends the
  request's one final response, an error saying so, before the model sees the request; the stub then refuses
  the model's send, as it refuses any send once a final one was tried (one that failed too).
"""

import json
import sys
from pathlib import Path

# the environment that wrote the repository, as the served model finds it
_PATHS = Path(__file__).with_name("python_path.txt")
sys.path.extend(p for p in _PATHS.read_text(encoding="utf-8").splitlines() if p and p not in sys.path)

import triton_python_backend_utils as pb_utils  # noqa: E402

from pointpillars_trt.apps.serve import triton_model  # noqa: E402

REFUSED = "answered before the model could: the stub refuses the model's answers"


class TritonPythonModel(triton_model.TritonPythonModel):
    def initialize(self, args):
        self.falls_short = json.loads(args["model_config"])["parameters"]["falls_short"]["string_value"]
        if self.falls_short == "metrics":
            del pb_utils.MetricFamily
        super().initialize(args)

    def execute(self, requests):
        if self.falls_short == "sends":
            for request in requests:
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(REFUSED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return super().execute(requests)
