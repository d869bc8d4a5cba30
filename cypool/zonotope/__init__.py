"""Zonotopes for certifying networks: DeepZ, end to end.

A zonotope is a numpy array whose last axis holds, for every neuron,
component 0 (the centre) and then the generators: neuron ``i`` takes the
values ``z[i, 0] + sum_j z[i, j] * e_j`` for every choice of the error terms
``e_j`` in ``[-1, 1]``, the same ``e_j`` for all neurons. An image is
``(C, H, W, E)``, the layout :func:`cypool.vector_conv2d` convolves, and a
dense activation ``(D, E)``: the dense form of ELINA's affine forms, with
the generators last.

Certifying one image against an L-infinity perturbation of ``eps``::

    z = from_box(x, eps)                      # (C, H, W, 1 + n)
    z = conv2d(z, w1, b1, stride=2)           # cypool.vector_conv2d
    z = relu(z)                               # DeepZ: grows E
    z = linear(flatten(z), w2, b2)            # (O, E)
    ok = certify(z, label)

or :class:`Network` for a whole trained stack. Results are not sound under
floating-point rounding: every bound is computed in the array's dtype with
ordinary rounding (as the DeepZ of the Adversarial Robustness Toolbox and
the PyTorch zonotopes of MN-BaB do; ERAN's ELINA rounds outwards and is
sound). float64, the default, keeps the error far below any margin that
matters; float32 runs about twice as fast.
"""
from ._functions import bounds, certify, conv2d, flatten, from_box, linear, relu
from ._layers import VectorAvgPool2d, VectorChannelAffine, VectorFlatten, VectorLinear, VectorReLU
from ._network import Network

__all__ = ["from_box", "bounds", "relu", "linear", "flatten", "conv2d", "certify", "Network",
           "VectorLinear", "VectorReLU", "VectorFlatten", "VectorChannelAffine", "VectorAvgPool2d"]
