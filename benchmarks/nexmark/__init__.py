"""Nexmark on Epochal: a generator that follows the Nexmark specification, the 23 queries (q0-q22, Flink
Nexmark numbering) written with the public job API, a DuckDB reference per query and a runner that SIGKILLs
each query's runs and compares the committed output exactly with the reference (README.md in this folder)."""
