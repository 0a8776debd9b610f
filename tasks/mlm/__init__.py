"""Task `mlm`: BERT-style masked-language-model pretraining on real text (seed paper Sec. 6.2)."""
