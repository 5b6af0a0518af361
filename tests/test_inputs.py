"""KernelInputs and input validation."""

import pytest
import torch

import gemmtune
from gemmtune.core.errors import InputError
from gemmtune.core.inputs import KernelInputs


def test_kernel_inputs_describe_mm_addmm_bmm():
    ki = KernelInputs.from_tensors("mm", torch.ones(8, 4), torch.ones(6, 4).t())
    assert (ki.M, ki.K, ki.N, ki.batch) == (8, 4, 6, 1)
    assert ki.b_layout() == "col" and ki.out_size == (8, 6)
    ki = KernelInputs.from_tensors("addmm", torch.ones(6), torch.ones(8, 4), torch.ones(4, 6), alpha=2, beta=0.5)
    assert ki.bias.size == (6,) and (ki.alpha, ki.beta) == (2.0, 0.5) and ki.describe() == "addmm(6, 8x4, 4x6)"
    ki = KernelInputs.from_tensors("bmm", torch.ones(3, 8, 4), torch.ones(3, 4, 6))
    assert ki.batch == 3 and ki.out_size == (3, 8, 6) and ki.flops == 2 * 3 * 8 * 4 * 6


def test_problem_key_is_stable_and_separates_problems():
    def key(*ts, **kw):
        return KernelInputs.from_tensors("mm", *ts, **kw).problem_key

    a, b = torch.ones(8, 4), torch.ones(4, 6)
    assert key(a, b) == key(torch.zeros(8, 4), torch.zeros(4, 6))
    assert key(a, b) != key(a, torch.ones(6, 4).t())  # strides are part of the problem
    assert key(a, b) != key(a.double(), b.double())
    assert KernelInputs.from_tensors("addmm", torch.ones(6), a, b, beta=0).problem_key != \
        KernelInputs.from_tensors("addmm", torch.ones(6), a, b).problem_key


BAD = [
    ("mm", (torch.ones(3), torch.ones(3, 3)), "mat1 must be 2-D"),
    ("mm", (torch.ones(3, 4), torch.ones(5, 3)), "inner dimensions differ"),
    ("mm", (torch.ones(3, 4), "b"), "mat2 must be a torch.Tensor"),
    ("mm", (torch.ones(3, 4),), "expected 2 tensors"),
    ("mm", (torch.ones(3, 4), torch.ones(4, 3, dtype=torch.float64)), "cast them to one dtype"),
    ("mm", (torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 3, dtype=torch.int32)), "supports float16"),
    ("bmm", (torch.ones(2, 3, 4), torch.ones(3, 4, 5)), "batch sizes differ"),
    ("bmm", (torch.ones(3, 4), torch.ones(4, 5)), "batch1 must be 3-D"),
    ("addmm", (torch.ones(7), torch.ones(3, 4), torch.ones(4, 5)), "does not broadcast"),
    ("addmm", (torch.ones(2, 3, 5), torch.ones(3, 4), torch.ones(4, 5)), "0-, 1- or 2-D"),
    ("conv", (torch.ones(3, 4), torch.ones(4, 5)), "unknown op"),
]


@pytest.mark.parametrize("op,tensors,needle", BAD)
def test_bad_inputs_raise_input_error_naming_the_problem(op, tensors, needle):
    with pytest.raises(InputError, match=needle):
        gemmtune.tune(op, *tensors)


def test_bad_scalars():
    with pytest.raises(InputError, match="alpha"):
        gemmtune.tune("addmm", torch.ones(5), torch.ones(3, 4), torch.ones(4, 5), alpha=float("nan"))


def test_input_error_is_a_value_error():
    assert issubclass(InputError, ValueError)


def test_device_argument_moves_tensors():
    sel = gemmtune.tune("mm", torch.ones(8, 4), torch.ones(4, 6), device="cpu", backends=("extern",))
    assert sel.problem.device == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA is not available"):
            gemmtune.tune("mm", torch.ones(8, 4), torch.ones(4, 6), device="cuda")


@pytest.mark.parametrize("shape", [(), (1,), (5,), (4,), (1, 1), (4, 1), (1, 5), (4, 5), (5, 4), (4, 2), (3, 5), (0,)])
def test_bias_shape_accepted_exactly_where_torch_broadcasts_it_to_the_output(shape):
    a, b = torch.ones(4, 3), torch.ones(3, 5)
    try:
        broadcasts = torch.broadcast_shapes(shape, (4, 5)) == (4, 5)
    except RuntimeError:
        broadcasts = False
    if broadcasts:
        assert KernelInputs.from_tensors("addmm", torch.ones(shape), a, b).bias.size == shape
    else:
        with pytest.raises(InputError, match="does not broadcast"):
            KernelInputs.from_tensors("addmm", torch.ones(shape), a, b)
