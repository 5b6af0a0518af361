"""Measurement: compiling candidates, timers, the correctness gate, runners and the worker process."""
