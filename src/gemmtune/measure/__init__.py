"""Measurement: compiling candidates, timers, the correctness gate, the Bench, its runners and the worker process.

Modules: `compile` (precompile, CompileJob, Launchers), `timers` (Measurement, CudaTimer, CpuTimer),
`correctness`, `bench` (Bench), `runners` (Runner, LocalRunner), `replay` (ReplayRunner), `isolation`
(SubprocessRunner, the worker pool), `process` (Worker), `jobs` and `worker` (the worker's side),
`factory` (runner_for).  Nothing is imported here: the worker process starts from `gemmtune.measure.worker`.
"""
