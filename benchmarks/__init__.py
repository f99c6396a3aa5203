"""The benchmark scripts, importable as a package from the repository root (their tests are in
``benchmarks/tests``). Each script still runs as ``python benchmarks/NAME.py``."""
