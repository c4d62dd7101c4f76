"""The top floor: the paper's experiments, on the library.

- :mod:`.ablations`: ``inline-attn reproduce ablations``, the paper's ablations over several seeds;
- :mod:`.reproduce`: ``inline-attn reproduce fmnist``, the four Fashion-MNIST variants and their table;
- :mod:`.dense_compare`: ``inline-attn seg compare`` / ``det compare``, InLine vs softmax backbones.

These modules may import any package; no library package imports them (tests/test_layering.py).
"""
