"""The effective-training-time benchmark (``python -m bench.ettr``; bench/README.md, section 8).

:mod:`~bench.ettr.causes` (the faults and their sources), :mod:`~bench.ettr.signals` and
:mod:`~bench.ettr.detection` (what the shipped rules raise for each, through promtool), :mod:`~bench.ettr.world`
(the physics), :mod:`~bench.ettr.responders` and :mod:`~bench.ettr.nightshift` (who acts),
:mod:`~bench.ettr.simulation` (one run), :mod:`~bench.ettr.calibration`, :mod:`~bench.ettr.benchmark` and
:mod:`~bench.ettr.report` (the whole benchmark and its tables).
"""
