"""One module per Hugging Face family: its config.json mapping, weight layout and
``FAMILY = Family(...)`` record (models/hf/family.py collects them)."""
