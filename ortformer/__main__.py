"""`python -m ortformer ...`: the same command line as the `ortformer` script."""
from .cli import main

main()
