"""Small test-only templates."""

import time

import torch

from gemmtune.choices import Choice
from gemmtune.templates.base import Template, source_hash


class ScriptedTemplate(Template):
    """A generated-kernel stand-in whose compile and results the test controls.

    mode: "ok" (correct torch.mm), "compile_error", "slow_compile", "wrong".
    """

    family = "numba"

    def __init__(self, uid="scripted", mode="ok", n_configs=2, runtime=(1, 2), sleep_s=5.0):
        self.uid, self.mode, self.n_configs, self.sleep_s = uid, mode, n_configs, sleep_s
        self.src_hash = source_hash(f"{uid}:{mode}")
        self.runtime_space = {"group": runtime}
        self.default_runtime = {"group": runtime[-1]}
        self.compiled = []

    def supports(self, ki):
        return True

    def compile_configs(self, ki):
        return [{"TILE": 8 * (i + 1)} for i in range(self.n_configs)]

    def compile(self, choice: Choice, ki, example):
        self.compiled.append(choice.binary_key)
        if self.mode == "compile_error":
            raise RuntimeError("out of resource: shared memory, Required: 999999")
        if self.mode == "slow_compile":
            time.sleep(self.sleep_s)
        wrong = self.mode == "wrong"

        def launch(tensors, out=None, group=1):
            a, b = tensors[-2], tensors[-1]
            res = torch.matmul(a, b)
            if wrong:
                res = res + 1.0
            if out is None:
                return res
            out.copy_(res)
            return out

        return launch
