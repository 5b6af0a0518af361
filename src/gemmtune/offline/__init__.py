"""Work away from a live tune: problem suites, sweeps, recorded datasets, replay and simulation."""
