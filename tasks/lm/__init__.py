"""Task `lm`: causal language modelling (CODA Table 1; Repulsive attention): data, TransformerLM, LMModule."""
