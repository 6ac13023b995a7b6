"""Imports of Hugging Face encoder folders into ortformer's own model family."""
