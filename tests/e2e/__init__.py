"""End-to-end tests: the whole loop on the real daemons (sim.stack), one stack per module."""
