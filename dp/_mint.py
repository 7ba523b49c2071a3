"""The capability that lets a DP mechanism in `dp` construct `Released` values.

Import it only from modules of this package that add calibrated noise and debit the ledger.
"""

MINT = object()
