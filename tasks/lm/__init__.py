"""Task `lm`: causal language modelling (CODA Table 1; Repulsive attention). Data side so far."""
