"""A cheaper launch path for compiled Triton kernels.

`kernel[grid](*args, **meta)` binds every argument, recomputes the specialisation key and looks the
binary up on every call: 15-30 us of Python on a 10-20 us decode-sized kernel, which an eager caller
pays and the fair timer charges (`CudaTimer(count_host=True)`).  A launcher built by `FastLaunch`
calls the compiled binary's own launcher directly, with raw pointers (the JIT path asks the driver
about every tensor's pointer on every call), after checking in about a microsecond that the call
specialises exactly as the warm-up call did: same integer arguments (except those the kernel
excludes from specialisation, e.g. the swizzle) and the same 16-byte alignment of every tensor.
Any other call, another current device, or a launch hook (profilers set one) goes through the JIT.

`FastLaunch.bind` goes one step further for the eager dispatch, whose key fixes the operands' shapes,
strides, dtypes and device: it keeps one call's full argument list and changes only the pointers, so
a warm dispatch builds no arguments at all (`base.bound_launcher`).

Example:
    >>> FastLaunch.build(None, None, (1, 1, 1), {}) is None   # no compiled binary: the JIT path
    True
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch


class FastLaunch:
    """Launch one compiled Triton binary for arguments that specialise like its warm-up call."""

    def __init__(self, compiled: Any, grid: Sequence[int], order: list[tuple[bool, Any]], example: Sequence[Any],
                 free: frozenset[int], device: int, runtime_knobs: Any = None, get_stream: Any = None):
        self._run = compiled.run
        self._function = compiled.function
        self._packed = compiled.packed_metadata
        self._grid = tuple(grid) + (1,) * (3 - len(grid))
        self._order = order
        # Positions (in the runtime arguments) of tensors and of specialised integers, with the
        # warm-up call's alignment flags and values.
        self._tensors = tuple(i for i, a in enumerate(example) if isinstance(a, torch.Tensor))
        self._aligned = tuple(example[i].data_ptr() % 16 == 0 for i in self._tensors)
        self._ints = tuple((i, a) for i, a in enumerate(example)
                           if i not in free and isinstance(a, int) and not isinstance(a, bool))
        self._device = device  # the binary is loaded in this device's context
        self._knobs = runtime_knobs  # triton.knobs.runtime: launch hooks (profilers) send calls through the JIT
        self._get_stream = get_stream or (lambda d: torch.cuda.current_stream(d).cuda_stream)

    def _hooked(self) -> bool:
        if self._knobs is None:
            return False
        for hook in (self._knobs.launch_enter_hook, self._knobs.launch_exit_hook):
            if hook is not None and getattr(hook, "calls", True):  # an empty HookChain is no hook
                return True
        return False

    @classmethod
    def build(cls, jit_fn: Any, compiled: Any, grid: Sequence[int], meta: Mapping[str, Any],
              example_args: Sequence[Any] = (), device: int | None = None) -> "FastLaunch | None":
        """The fast launcher of `compiled` (from `jit_fn.warmup(*example_args, grid=grid, **meta)`),
        or None where this Triton has no direct launch path.  `device`: the CUDA device the binary
        is loaded on (default: the current one)."""
        if jit_fn is None or compiled is None:
            return None
        try:
            from triton import knobs

            params = jit_fn.params
            if compiled.function is None:
                return None
        except Exception:  # noqa: BLE001 - another Triton version: keep the JIT path
            return None
        try:
            from triton.runtime import driver

            get_stream = driver.active.get_current_stream
        except Exception:  # noqa: BLE001
            get_stream = None
        order = []
        for p in params:
            if p.is_constexpr:
                if p.name not in meta:
                    return None
                order.append((True, meta[p.name]))
            else:
                order.append((False, None))
        if sum(1 for const, _ in order if not const) != len(example_args):
            return None
        free = frozenset(i for i, p in enumerate(q for q in params if not q.is_constexpr)
                         if getattr(p, "do_not_specialize", False))
        return cls(compiled, grid, order, example_args, free,
                   torch.cuda.current_device() if device is None else device, knobs.runtime, get_stream)

    def _pointers(self, args: Sequence[Any]) -> list[int] | None:
        """Raw pointers of the tensor arguments, or None if the call specialises differently."""
        for i, v in self._ints:
            if args[i] != v:
                return None
        ptrs = []
        for i, aligned in zip(self._tensors, self._aligned):
            t = args[i]
            if not isinstance(t, torch.Tensor):
                return None
            p = t.data_ptr()
            if (p % 16 == 0) != aligned:
                return None
            ptrs.append(p)
        return ptrs

    def matches(self, args: Sequence[Any]) -> bool:
        """Whether `args` specialise exactly as the warm-up call's did."""
        return self._pointers(args) is not None

    def bind(self, args: Sequence[Any], inputs: Sequence[torch.Tensor],
             out: torch.Tensor) -> Callable[[Sequence[torch.Tensor], torch.Tensor], bool] | None:
        """A launcher for one problem: `args` are one call's runtime arguments, built from the
        operands `inputs` and the output `out`; every later call `bound(tensors, out)` must have
        operands of the same shapes, strides, dtypes and device (what a dispatch key fixes), so all
        integer and float arguments are those of `args` and only the pointers change.  It returns
        False, launching nothing, where the call would specialise differently (another 16-byte
        alignment, another device, a launch hook): the caller then takes the general path.  None
        where `args` cannot be bound (a specialisation other than the warm-up's, an argument tensor
        that is none of `inputs` or `out`, one operand object passed twice)."""
        if self._pointers(args) is None or len({id(t) for t in inputs}) != len(inputs):
            return None
        sources = [*inputs, out]
        runtime_at = [i for i, (const, _) in enumerate(self._order) if not const]
        template: list[Any] = []
        it = iter(args)
        for const, value in self._order:
            template.append(value if const else next(it))
        slots = []  # (position in the launcher's arguments, index into tensors + [out], 16-byte aligned)
        for i, aligned in zip(self._tensors, self._aligned):
            j = next((j for j, t in enumerate(sources) if t is args[i]), None)
            if j is None:
                return None
            slots.append((runtime_at[i], j, aligned))
            template[runtime_at[i]] = 0  # no reference to this call's tensors is kept
        return self._bound(tuple(template), tuple(slots))

    def _bound(self, template: tuple, slots: tuple[tuple[int, int, bool], ...]) -> Callable[..., bool]:
        run, function, packed, device, get_stream, hooked = (self._run, self._function, self._packed, self._device,
                                                             self._get_stream, self._hooked)
        g0, g1, g2 = self._grid
        current_device = torch.cuda.current_device

        def bound(tensors: Sequence[torch.Tensor], out: torch.Tensor) -> bool:
            if current_device() != device or hooked():
                return False
            ptrs = []
            for t in tensors:
                if t.get_device() != device:
                    return False
                ptrs.append(t.data_ptr())
            ptrs.append(out.data_ptr())
            full = list(template)
            for pos, j, aligned in slots:
                p = ptrs[j]
                if (p & 15 == 0) != aligned:
                    return False
                full[pos] = p
            run(g0, g1, g2, get_stream(device), function, packed, None, None, None, *full)
            return True

        return bound

    def __call__(self, args: Sequence[Any]) -> bool:
        """Launch with `args` (the kernel's runtime arguments in order); False, launching nothing,
        when they would need another specialisation (the caller then uses the JIT)."""
        if torch.cuda.current_device() != self._device or self._hooked():
            return False
        ptrs = self._pointers(args)
        if ptrs is None:
            return False
        runtime = list(args)
        for i, p in zip(self._tensors, ptrs):
            runtime[i] = p
        it = iter(runtime)
        full = [value if const else next(it) for const, value in self._order]
        g0, g1, g2 = self._grid
        self._run(g0, g1, g2, self._get_stream(self._device), self._function, self._packed, None, None, None, *full)
        return True
