"""What the warm-up loads (warmup.py): it imports only core."""
