"""pycni's benchmark harness: the default chain over N containers, per backend, side by side.

Entry points: ``bench/run.py`` (measure, write JSON) and ``bench/report.py`` (JSON → markdown,
PNG). Everything runs inside network namespaces the harness creates and removes; see README.md.
"""
