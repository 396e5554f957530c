"""Runnable examples (`python examples/train_tiny.py`), importable from the repository root so tests call them."""
