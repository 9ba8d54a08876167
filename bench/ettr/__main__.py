"""``python -m bench.ettr``: see :mod:`bench.ettr.benchmark`."""

from bench.ettr.benchmark import main

raise SystemExit(main())
