"""`python -m kafkatap ARGS`: the same CLI as the `kafkatap` script, for environments without the script on PATH."""

from kafkatap.cli import main

main()
