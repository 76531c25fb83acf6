"""Array-likes that stand for other libraries' arrays where those are not installed (tests of the conversions)."""

from __future__ import annotations

import numpy as np


class GradTensorLike:
    """An array-like whose host conversion raises RuntimeError, as a torch tensor that requires grad does
    ("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")."""

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
