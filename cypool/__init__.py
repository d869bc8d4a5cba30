"""cypool: fast, correct CPU pooling layers for numpy CNNs.

Cython + OpenMP kernels behind numpy functions and layer classes:

* :func:`max_pool2d`, :func:`max_pool2d_backward`, :func:`max_unpool2d` and
  the layers :class:`MaxPool2d`, :class:`MaxUnpool2d`;
* :func:`argmax2d`, the (row, col) of every feature map's maximum, and the
  layer :class:`GlobalMaxPool2d`;
* :func:`conv2d`, :func:`conv2d_backward`: standard NCHW convolution, and
  the layer :class:`Conv2d`;
* :func:`vector_conv2d`, :func:`vector_conv2d_backward`: convolution over
  images whose pixels are vectors, and the layer :class:`VectorConv2d`;
* :mod:`cypool.zonotope`: certification of networks on zonotopes (DeepZ),
  with the layers :class:`VectorReLU`, :class:`VectorLinear`,
  :class:`VectorFlatten`, and the numpy layers :class:`Linear`,
  :class:`ReLU`, :class:`Flatten` to train the networks it certifies.
"""
from ._version import __version__
from ._backend import show_config
from .argmax import argmax2d
from .pooling import max_pool2d, max_pool2d_backward, max_unpool2d, max_unpool2d_backward
from .conv import conv2d, conv2d_backward
from .vector_conv import vector_conv2d, vector_conv2d_backward
from .layers import (Conv2d, Flatten, GlobalMaxPool2d, Layer, Linear, MaxPool2d, MaxUnpool2d, ReLU,
                     VectorConv2d)
from . import zonotope
from .zonotope import VectorAvgPool2d, VectorChannelAffine, VectorFlatten, VectorLinear, VectorReLU


__all__ = [
    "max_pool2d",
    "max_pool2d_backward",
    "max_unpool2d",
    "max_unpool2d_backward",
    "Layer",
    "MaxPool2d",
    "MaxUnpool2d",
    "argmax2d",
    "GlobalMaxPool2d",
    "show_config",
    "conv2d",
    "conv2d_backward",
    "Conv2d",
    "vector_conv2d",
    "vector_conv2d_backward",
    "VectorConv2d",
    "Linear",
    "ReLU",
    "Flatten",
    "VectorLinear",
    "VectorReLU",
    "VectorFlatten",
    "VectorChannelAffine",
    "VectorAvgPool2d",
    "zonotope",
    "__version__",
]
