"""The pure core: Nightshift's decisions and vocabularies, apart from the I/O that carries them out.

What belongs here decides or names (incident and repair policy, guards, paging, diagnosis, playbooks, states, the
scheduler seam's pure half); it reads files at most and imports no I/O library (network, database, process, web) and
nothing of ``app.store``, ``app.engine`` or ``app.clients``. Enforced by pyproject.toml's "pure-core" import contract
(lint-imports), by ``mypy --strict``'s flags on ``app.domain.*``, and by tests/unit/test_purity.py, which imports every
module here alone to see what it loads. A new pure module is covered by being put here.
"""
