"""The project's studies, beside the library (research/README.md indexes them). research/ imports trl_otb and
benchmarks; nothing imports research/. Run its modules from the repository root as ``python -m research.<module>``."""
