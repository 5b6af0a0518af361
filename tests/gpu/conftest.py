import pytest
import torch

if not torch.cuda.is_available():
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def _cuda_seed():
    torch.cuda.manual_seed(0)
