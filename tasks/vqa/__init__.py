"""Task `vqa`: multi-view visual question answering (doubly-normalized attention paper, Sec. 6.1).

synthetic.py (default data; its scenes in synthetic_scenes.py, its questions in
synthetic_questions.py), vqav2.py (real VQA-v2 + MMF features), metric.py (VQA accuracy),
model.py (multi-view fusion + Pythia-like backbone), dataset.py (encoded splits, feature stores,
batches), datamodule.py, module.py.
"""
