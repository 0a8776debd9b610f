"""Task `vqa`: multi-view visual question answering (doubly-normalized attention paper, Sec. 6.1).

synthetic.py (default data), vqav2.py (real VQA-v2 + MMF features), metric.py (VQA accuracy),
model.py (multi-view fusion + Pythia-like backbone), datamodule.py, module.py.
"""
