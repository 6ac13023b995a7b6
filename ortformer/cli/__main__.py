"""`python -m ortformer.cli ...`: the same command line as the `ortformer` script."""
from . import main

main()
