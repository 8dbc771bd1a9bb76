"""Masked pre-training on sequences: a run that writes an encoder for fine-tuning (`job.py`)."""
