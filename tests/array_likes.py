"""Array-likes that stand for other libraries' arrays where those are not installed (tests of the conversions)."""

from __future__ import annotations

import numpy as np


class GradTensorLike:
    """An array-like whose host conversion raises RuntimeError, as a torch tensor that requires grad does
    ("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")."""

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")


class HostDlpackLike:
    """A host array that speaks DLPack too, on the CPU (kDLCPU), as a torch CPU tensor does."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return self.values

    def __dlpack__(self, **kwargs: object) -> object:
        return self.values.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return 1, 0


class CudaInterfaceOnly:
    """A GPU array known by the CUDA array interface alone (no ``__array__``), as a Numba device array or a
    framework's raw device buffer is: its data lies in device memory that the host cannot read."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (0, False), "version": 3}
