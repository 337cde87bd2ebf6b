"""``python -m pycni``: the ``pycni`` command."""

from .cli import main

main()
