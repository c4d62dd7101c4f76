"""Dense prediction's models: the backbone adapter over a registered InLine model, the decode
heads and neck, the segmentor (encoder-decoder), the FCOS detector, box operations and the
losses the models train with.

What belongs here maps images to logits, boxes or losses; it imports neither ``dense.data`` nor a
task module (``tests/test_layering.py``): a model knows tensors, not data sets or runs."""
