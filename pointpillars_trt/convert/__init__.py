"""Checkpoint -> model dir: the safe .pth reader, the weight layouts, ONNX export, OpenPCDet configs."""
