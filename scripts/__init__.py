"""Development scripts. A package so that tests and benchmarks import ``scripts.servers``
even should an installed distribution also ship a top-level ``scripts``."""
