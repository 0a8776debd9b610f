"""Pieces shared by the text tasks (mlm, headline): the Debian corpus and the packaged BERT files."""
