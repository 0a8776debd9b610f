"""attnlab: experiments on attention normalization (UNAS/DNAS/HNAS/Sinkhorn) and head interaction."""

__version__ = "0.1.0"
