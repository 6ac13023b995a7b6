"""Helpers shared across the test folders, imported as `support.<module>` (pytest puts tests/ on
sys.path through pyproject's `pythonpath`): exported tiny models, the CLI runner, the Hugging
Face oracles, text models and the reliability figures."""
