"""The HTTP receiver: validates CDC batches and lands them durably in staging before acking."""
