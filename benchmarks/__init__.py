"""The benchmark scripts, run from the repository root as ``python -m benchmarks.<script>`` (docs/benchmarks.md lists
the commands); what they share is in ``benchmarks.common``."""
