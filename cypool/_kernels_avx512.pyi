# The AVX-512 variant has the baseline's functions but the pooling family's
# (max pooling, unpooling, argmax), which it does not compile.
from cypool._kernels_baseline import __test__ as __test__
from cypool._kernels_baseline import openmp_info as openmp_info
from cypool._kernels_baseline import max_threads as max_threads
from cypool._kernels_baseline import last_team_size as last_team_size
from cypool._kernels_baseline import set_claiming as set_claiming
from cypool._kernels_baseline import crowded as crowded
from cypool._kernels_baseline import set_crowded as set_crowded
from cypool._kernels_baseline import vector_conv2d_forward as vector_conv2d_forward
from cypool._kernels_baseline import vector_conv2d_input_grad as vector_conv2d_input_grad
from cypool._kernels_baseline import vector_conv2d_weight_grad as vector_conv2d_weight_grad
from cypool._kernels_baseline import channel_block as channel_block
from cypool._kernels_baseline import conv2d_forward as conv2d_forward
from cypool._kernels_baseline import conv2d_weight_grad as conv2d_weight_grad
from cypool._kernels_baseline import conv2d_input_grad_col2im as conv2d_input_grad_col2im
from cypool._kernels_baseline import conv2d_direct as conv2d_direct
from cypool._kernels_baseline import conv2d_direct_backward as conv2d_direct_backward
from cypool._kernels_baseline import memo_remember as memo_remember
from cypool._kernels_baseline import memo_forget as memo_forget
from cypool._kernels_baseline import plain_array as plain_array
from cypool._kernels_baseline import memo_forward as memo_forward
from cypool._kernels_baseline import memo_backward as memo_backward
from cypool._kernels_baseline import cpu_features as cpu_features
from cypool._kernels_baseline import zono_bounds as zono_bounds
from cypool._kernels_baseline import zono_relu as zono_relu
from cypool._kernels_baseline import MEMO_CONV2D as MEMO_CONV2D
from cypool._kernels_baseline import MEMO_VECTOR_CONV2D as MEMO_VECTOR_CONV2D
