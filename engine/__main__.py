"""`python -m llmdeploy_engine serve ...` runs the engine's command line."""

from llmdeploy_engine.cli import main

main()
