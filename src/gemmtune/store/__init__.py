"""Persistence: the SQLite store of timings and picks, and lookup tables read from files."""
