"""Models and data for federated NLP: offline backbones, named adapter sets, heads, loaders, partitioners.

Submodules are imported explicitly (``from nlp_models.adapters import attach_adapters``) so that
``import nlp_models`` stays cheap and does not pull in transformers.
"""
