"""Offline corpora (``loaders``), the ``TextDataset`` type and splits (``dataset``), non-IID
partitioners (``partition``), tokenisation and batching (``tokenize``) and sentence embeddings (``embed``)."""
