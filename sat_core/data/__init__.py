"""Data: Karpathy-format datasets and batching, the image loader, the vocabulary, caption words, object masks."""
