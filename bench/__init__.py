"""Nightshift's benchmarks: webhook ingest against a bare-Flask floor, decision cost, memory, profile.

See bench/README.md for the results and how to rerun them (``make bench``).
"""
