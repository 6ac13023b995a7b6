import sys
from pathlib import Path

# hf_support.py: the shared checks of the Hugging Face family tests
sys.path.insert(0, str(Path(__file__).parent))
